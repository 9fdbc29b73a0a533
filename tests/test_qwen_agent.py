"""qwen-agent BaseTool wrapping (optional extra ``qwen``)."""

from __future__ import annotations

import importlib.util

import pytest

from toolgym.runtime import run_sync
from toolgym.tools.base import ToolCall, ToolErrorKind
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.qwen_agent import from_qwen_agent, qwen_parameters_to_schema


def test_legacy_parameter_list_to_schema() -> None:
    legacy = [
        {"name": "query", "type": "string", "description": "what to look up", "required": True},
        {"name": "k", "type": "integer", "description": "how many"},
        {"name": "odd", "type": "str"},  # not a JSON-schema type: dropped, anything accepted
    ]
    s = qwen_parameters_to_schema(legacy)
    assert s == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look up"},
            "k": {"type": "integer", "description": "how many"},
            "odd": {},
        },
        "required": ["query"],
    }
    assert qwen_parameters_to_schema({"properties": {"x": {"type": "number"}}})["type"] == "object"
    with pytest.raises(ValueError, match="name"):
        qwen_parameters_to_schema([{"type": "string"}])


@pytest.mark.skipif(
    importlib.util.find_spec("qwen_agent") is None,
    reason="qwen-agent is not installed (optional extra `toolgym[qwen]`)",
)
def test_real_qwen_agent_base_tool() -> None:
    from qwen_agent.tools.base import BaseTool, register_tool

    @register_tool("toolgym_test_multiply")
    class Multiply(BaseTool):
        description = "Multiply two integers."
        parameters = [  # noqa: RUF012 - qwen-agent declares it this way
            {"name": "a", "type": "integer", "description": "first", "required": True},
            {"name": "b", "type": "integer", "description": "second", "required": True},
        ]

        def call(self, params, **kwargs):
            p = self._verify_json_format_args(params)
            if p["b"] == 0:
                raise ZeroDivisionError("b must not be zero here")
            return str(p["a"] * p["b"])

    (by_instance,) = from_qwen_agent([Multiply()])
    (by_name,) = from_qwen_agent(["toolgym_test_multiply"])
    assert by_instance.name == by_name.name == "toolgym_test_multiply"
    ex = ToolExecutor([by_instance])
    ok, bad, err = run_sync(
        ex.run_many(
            [
                ToolCall("toolgym_test_multiply", {"a": 6, "b": 7}),
                ToolCall("toolgym_test_multiply", {"a": 6}),
                ToolCall("toolgym_test_multiply", {"a": 6, "b": 0}),
            ]
        )
    )
    assert ok.ok and ok.content == "42"
    assert bad.error_kind is ToolErrorKind.INVALID_ARGUMENTS  # validated before qwen's call()
    assert err.error_kind is ToolErrorKind.EXCEPTION and "ZeroDivisionError" in err.content
