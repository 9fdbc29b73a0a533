"""DeepSeek-V3.2 DSML: ``<｜DSML｜function_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter name="KEY"
string="true|false">VALUE</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>``."""

from __future__ import annotations

import json
from typing import Any

from toolgym.format.families.invoke import Invoke, parse_invoke_blocks
from toolgym.format.families.schema_types import SchemaTypedParameters, branch_type, branches
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["DeepSeekV32Parser"]

DSML = "｜DSML｜"
OPEN, CLOSE = f"<{DSML}function_calls>", f"</{DSML}function_calls>"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _types(spec: Any) -> set[str | None]:
    return {branch_type(b) for b in branches(spec)}


@register_parser("deepseek_v32")
class DeepSeekV32Parser(SchemaTypedParameters, ToolCallParser):
    """DeepSeek-V3.2 DSML calls: a ``<｜DSML｜function_calls>`` block of ``<｜DSML｜invoke name="NAME">``
    elements holding ``<｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>`` elements.
    ``string="true"``: the value is the text itself; ``string="false"``: the value is JSON.

    Errors reported (vLLM repairs or guesses on most of them): an unclosed block, invoke or parameter, text between
    invokes or parameters, a missing ``string`` attribute, a ``string="false"`` value that is not JSON, a text
    value for a parameter whose schema admits no string, a non-string value for a parameter whose schema admits
    only strings, a parameter the tool's schema does not have (vLLM unwraps an ``arguments``/``input`` wrapper).
    """

    stop_tokens = ("<｜end▁of▁sentence｜>",)
    template_markers = ((f"{DSML}function_calls",),)


    def _parse(self, text: str) -> ParsedTurn:
        return parse_invoke_blocks(text, OPEN, CLOSE, DSML, self._call)

    def _call(self, inv: Invoke) -> ToolCall:
        known = self.param_schemas.get(inv.name)
        args: dict[str, Any] = {}
        for key, attrs, raw in inv.params:
            err = None
            flag = attrs.pop("string", None)
            if attrs or flag not in ("true", "false"):
                err = 'a parameter needs string="true" or string="false" (and no other attribute)'
            elif known is not None and key not in known:
                err = f"{inv.name!r} has no parameter {key!r}"
            else:
                types = _types(known[key]) if known is not None else {None}
                if flag == "true":
                    if None not in types and "string" not in types:
                        err = f'string="true" for {key!r}, whose schema admits no string'
                    else:
                        args[key] = raw
                else:
                    try:
                        value = json.loads(raw, parse_constant=_no_constant)
                    except (ValueError, RecursionError):
                        err = f'the string="false" value of {key!r} is not JSON: {raw.strip()[:40]!r}'
                    else:
                        if types == {"string"} and not isinstance(value, str):
                            err = f"{key!r} admits only strings, got JSON {type(value).__name__}"
                        elif isinstance(value, float) and value.is_integer() and types & {"integer", "number"}:
                            value = int(value)
                        args[key] = value
            if err:
                return ToolCall(inv.name, raw=inv.raw, parse_error=err)
        return ToolCall(inv.name, args, raw=inv.raw)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        """``content``, then the block exactly as DeepSeek-V3.2's encoding renders structured ``tool_calls``
        (``"\n\n"`` first even without content; a string value as ``string="true"`` text, any other as JSON)."""
        if not calls:
            return content
        invokes = []
        for name, args in calls:
            params = "\n".join(
                f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                f"{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</{DSML}parameter>"
                for k, v in args.items()
            )
            invokes.append(f'\n<{DSML}invoke name="{name}">\n{params}\n</{DSML}invoke>')
        return f"{content}\n\n{OPEN}" + "".join(invokes) + f"\n{CLOSE}"
