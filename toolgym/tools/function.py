"""``@tool``: turn a plain Python function (sync or async) into a :class:`~toolgym.tools.base.Tool`.

The JSON schema comes from the signature and the Google-style docstring through
``transformers.utils.get_json_schema`` (the same function chat templates use): name, description and
parameters are what ``tokenizer.apply_chat_template(tools=[fn])`` would show. One difference: a return
annotation is not shown (``get_json_schema`` adds a ``"return"`` key for it, which transformers and TRL render),
so for token-identical prompts across the two, give such functions no return annotation.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypedDict, Unpack, overload

from toolgym.tools.base import Tool, ToolError, ToolErrorKind, text_or_images
from toolgym.tools.threads import ThreadLane

__all__ = ["FunctionTool", "ToolOptions", "tool"]


class ToolOptions(TypedDict, total=False):
    """The keyword options of :class:`FunctionTool` (and of ``@tool(...)``); their defaults are the class's."""

    name: str | None
    description: str | None
    timeout_s: float | None
    max_concurrency: int | None
    cacheable: bool
    max_workers: int | None
    max_abandoned: int


class FunctionTool(Tool):
    """A tool backed by a Python function.

    Sync functions run on the tool's own :class:`~toolgym.tools.threads.ThreadLane` (daemon threads, at most
    ``max_workers`` busy, at most ``max_abandoned`` left running past a timeout) so they never block the event
    loop, never starve another tool's calls, and never keep the process from exiting. A timeout cancels the
    awaiting task but cannot stop a running thread, so long sync work should be written async or as a subprocess
    tool. Arguments the function's signature does not accept are ``invalid_arguments``. The return value is
    converted to text with ``str`` unless it is already a string, on the lane (an async function's result too), so a
    slow ``__str__`` is bounded by the call's timeout and never holds the event loop. A return value with images
    (a PIL image, a :class:`toolgym.images.Image`, an image block ``{"type": "image", "data": bytes, "mime_type":
    "image/png"}``, or a list mixing text and images) is passed on as it is: the executor checks its images and
    shows each as its placeholder to a text-only policy.

    Args:
        max_workers: threads of the lane (default: ``max_concurrency``, else 32).
        max_abandoned: calls that may keep running past their timeout before new calls are refused with
            ``timeout`` (default 16).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = None,
        max_concurrency: int | None = None,
        cacheable: bool = True,
        max_workers: int | None = None,
        max_abandoned: int = 16,
    ) -> None:
        from transformers.utils import get_json_schema

        spec = get_json_schema(fn)["function"]
        self.fn = fn
        self.name = name or spec["name"]
        self.description = description if description is not None else spec.get("description", "")
        self.parameters = spec.get("parameters", {"type": "object", "properties": {}})
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.cacheable = cacheable
        self._is_async = inspect.iscoroutinefunction(fn)
        self._signature = inspect.signature(fn)
        # sync tools run here; async ones turn a non-str result into text here
        self.lane = ThreadLane(self.name, max_workers or max_concurrency or 32, max_abandoned)

    async def acall(self, arguments: Mapping[str, Any]) -> Any:
        try:
            self._signature.bind(**arguments)
        except TypeError as e:  # an extra or missing argument: the model's mistake, not the tool's
            raise ToolError(f"{self.name}: {e}", kind=ToolErrorKind.INVALID_ARGUMENTS) from None
        if self._is_async:
            out = await self.fn(**arguments)
            if isinstance(out, str):
                return text_or_images(out)
            # a non-str result's __str__ is the tool's code too: on a thread, inside the call's timeout
            return await self.lane.run(text_or_images, out)
        # the conversion to text runs on the lane too: a huge non-str result never stalls the event loop
        return await self.lane.run(_as_text, self.fn, arguments)


def _as_text(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> Any:
    return text_or_images(fn(**arguments))


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...
@overload
def tool(**options: Unpack[ToolOptions]) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(fn: Callable[..., Any] | None = None, /, **options: Unpack[ToolOptions]) -> Any:
    """Decorate a function to make it a :class:`FunctionTool`.

    The function needs type hints on every argument and a docstring with an ``Args:`` section (that is
    what ``get_json_schema`` reads). Usable bare (``@tool``) or with options
    (``@tool(timeout_s=5, max_concurrency=8)``).

    Example::

        @tool
        async def add(a: int, b: int) -> int:
            '''Add two integers.

            Args:
                a: the first addend
                b: the second addend
            '''
            return a + b
    """
    if fn is not None:
        return FunctionTool(fn)
    return lambda f: FunctionTool(f, **options)
