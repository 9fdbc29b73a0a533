"""Core tool types: what a model can call, what a call looks like, and what comes back.

Every tool call a model makes gets exactly one :class:`ToolResult` (invariant 3 of docs/design.md): either the
tool's output, or a classified error (:class:`ToolErrorKind`) whose message the model can read.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from toolgym.images import Image, has_images, split_parts

__all__ = ["Seconds", "Tool", "ToolCall", "ToolError", "ToolErrorKind", "ToolResult"]


class Seconds(float):
    """A wall-clock measurement in seconds.

    Measurements differ run to run, so two ``Seconds`` always compare equal: infos and trajectories of two runs
    with the same seed and policy are then equal (invariant 5 of docs/design.md is about behaviour, not timing, and
    Gymnasium's ``check_env`` compares step infos). Use ``float(x)`` to compare values.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Seconds)

    def __ne__(self, other: object) -> bool:
        return not isinstance(other, Seconds)

    def __hash__(self) -> int:
        return 0


class ToolErrorKind(StrEnum):
    """Why a tool call produced no normal output. The value is the metric / JSON name."""

    PARSE_ERROR = "parse_error"  #: the model's call text could not be parsed into name + arguments
    UNKNOWN_TOOL = "unknown_tool"  #: the name is not one of the env's tools
    INVALID_ARGUMENTS = "invalid_arguments"  #: arguments fail the tool's JSON schema
    TIMEOUT = "timeout"  #: the call outran its timeout and was cancelled
    EXCEPTION = "exception"  #: the tool raised, or reported an error itself (MCP ``isError``)
    CALL_LIMIT = "call_limit"  #: the turn made more calls than the env runs per turn; this one was not run
    INVALID_IMAGE = "invalid_image"  #: the result held an image that is refused (not an image, corrupt, too big,
    #: an unknown MIME type, past the images per turn); its text and its other images are kept


class ToolError(Exception):
    """Raise from a tool to report a classified failure with a message meant for the model.

    Args:
        message: text the model will read in the tool response.
        kind: the error kind (default ``exception``).
        retryable: ``True`` when trying again may succeed (a dropped connection, a busy service); the
            executor retries such errors up to its ``max_retries``.
    """

    def __init__(
        self, message: str, *, kind: ToolErrorKind = ToolErrorKind.EXCEPTION, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.retryable = retryable


@dataclass
class ToolCall:
    """One tool call as parsed from a model turn.

    Attributes:
        name: the tool name the model asked for ("" when the call could not be parsed).
        arguments: the decoded JSON arguments (``{}`` when unparsable).
        raw: the exact text of the call in the model's output (for error messages and viewers).
        id: a call id, unique within the episode (``"call_<turn>_<index>"``).
        parse_error: ``None`` for a well-formed call; otherwise why it could not be parsed. A call with a
            parse error is never executed; it gets a ``parse_error`` result.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""
    id: str = ""
    parse_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "arguments": self.arguments,
            "raw": self.raw,
            "parse_error": self.parse_error,
        }


@dataclass
class ToolResult:
    """The answer to one :class:`ToolCall`.

    Attributes:
        call: the call this answers.
        content: the text the model reads (the output, or the error message).
        error_kind: ``None`` on success, otherwise the classified failure.
        latency_s: wall time in seconds spent executing (0 for calls never executed, e.g. parse errors).
        attempts: how many times the tool was invoked (retries included; 0 when never invoked).
        cached: ``True`` when served from the executor's cache / replay log.
        images: the result's images, in order; each one's placeholder (``[image: image/png, N bytes]``) stands in
            ``content`` where the image was, which is what a text-only policy reads (:meth:`parts` splits it).
    """

    call: ToolCall
    content: str
    error_kind: ToolErrorKind | None = None
    latency_s: float = field(default=0.0, compare=False)
    attempts: int = 0
    cached: bool = False
    images: list[Image] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    def parts(self) -> list[str | Image]:
        """``content`` as ordered text and image parts (:func:`toolgym.images.split_parts`): what a renderer that
        shows images to the model walks; ``[content]`` when the result has no images."""
        return split_parts(self.content, self.images) if self.images else [self.content]

    def to_dict(self) -> dict[str, Any]:
        """A JSON object; the images appear as :meth:`~toolgym.images.Image.ref` (no bytes: a trajectory row stores
        each image's bytes once, in its ``images`` table)."""
        row = {
            "call": self.call.to_dict(),
            "content": self.content,
            "error_kind": self.error_kind.value if self.error_kind else None,
            "latency_s": Seconds(self.latency_s),
            "attempts": self.attempts,
            "cached": self.cached,
        }
        if self.images:
            row["images"] = [img.ref() for img in self.images]
        return row


def error_text(kind: ToolErrorKind, message: str) -> str:
    """The observation text for a failed call: ``Error (<kind>): <message>``."""
    return f"Error ({kind.value}): {message}"


class Tool(abc.ABC):
    """Something a model can call.

    Subclasses set ``name``, ``description`` and ``parameters`` (a JSON-schema ``object``) and implement
    :meth:`acall`. Sync work should be pushed to a thread inside ``acall`` (see ``@tool``), never block the
    event loop.

    Attributes:
        name: the function name the model uses.
        description: one paragraph shown to the model.
        parameters: JSON schema of the arguments object (``{"type": "object", "properties": ..., "required": ...}``).
        timeout_s: per-call timeout in seconds; ``None`` uses the executor's default.
        max_concurrency: per-tool cap on calls in flight; ``None`` means only the executor's global cap.
        cacheable: ``False`` for tools with side effects or randomness (never served from cache).
    """

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}
    timeout_s: float | None = None
    max_concurrency: int | None = None
    cacheable: bool = True

    @abc.abstractmethod
    async def acall(self, arguments: Mapping[str, Any]) -> Any:
        """Run the tool on already-validated ``arguments`` and return the text the model reads, or a value with
        images (an :class:`~toolgym.images.Image`, a PIL image, an image content block, or a list mixing text and
        images: :func:`toolgym.images.has_images`), whose images the executor checks.

        Raise :class:`ToolError` for a classified failure (``retryable=True`` if a retry may help); any other
        exception is reported as ``exception``.
        """

    def schema(self) -> dict[str, Any]:
        """The OpenAI / chat-template tool spec: ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources (sessions, processes). Called once when the owning executor closes."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def canonical_arguments(arguments: Mapping[str, Any]) -> str:
    """A canonical JSON text of ``arguments`` (sorted keys, no spaces): the cache / replay key."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def text_of(out: Any) -> str:
    """The text of a tool's return value as an exact ``str``: a ``str`` as is, anything else through ``str()``. A
    subclass of ``str`` is copied into a plain ``str`` (``str.__str__``, which runs none of the subclass's code), so
    no later ``str()`` or ``encode()`` of the result runs a tool's code outside its call's timeout."""
    text = out if isinstance(out, str) else str(out)
    return text if type(text) is str else str.__str__(text)


def text_or_images(out: Any) -> Any:
    """A tool's return value as the executor takes it: a value that carries images
    (:func:`toolgym.images.has_images`) as it is (the executor checks its images), anything else as
    :func:`text_of`."""
    return out if has_images(out) else text_of(out)
