"""vLLM's cases for ``kimi_k2``, ``deepseek_v32``, ``minimax_m2`` and ``pythonic`` / ``llama4_pythonic``.

MiniMax-M2's vLLM tests drive only its streaming parser; the calls they assert once the stream ends are the
turn's calls, taken here as data like the non-streaming cases."""

from __future__ import annotations

from tests.vllm_cases.base import Case, tool

S = {"type": "string"}
KIMI = "test_kimi_k2_tool_parser.py::TestExtractToolCalls::"
DS32 = "test_deepseekv32_tool_parser.py::TestExtractToolCalls::"
DS32S = "test_deepseekv32_tool_parser.py::TestExtractToolCallsStreaming::"
MM = "test_minimax_m2_tool_parser.py::"
PY = "test_pythonic_tool_parser.py::"
L4 = "test_llama4_pythonic_tool_parser.py::"

# -- Kimi-K2 markers
SB, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def _kimi(call_id: str, args: str) -> str:
    return f"<|tool_call_begin|>{call_id} <|tool_call_argument_begin|>{args}<|tool_call_end|>"


def _wrap(*calls: str) -> str:
    return SB + "".join(calls) + SE


# -- DSML markers
FC, FCE, INV, INVE = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>", '<｜DSML｜invoke name="', "</｜DSML｜invoke>"


def _p(key: str, value: str, string: str = "true") -> str:
    return f'<｜DSML｜parameter name="{key}" string="{string}">{value}</｜DSML｜parameter>'


def _dsml(*invokes: tuple[str, list[str]]) -> str:
    body = "".join(f'{INV}{name}">\n' + "".join(p + "\n" for p in params) + f"{INVE}\n" for name, params in invokes)
    return f"{FC}\n{body}{FCE}"


def _mm(*invokes: str) -> str:
    return "<minimax:tool_call>" + "".join(invokes) + "</minimax:tool_call>"


def _inv(name: str, *params: tuple[str, str]) -> str:
    return f'<invoke name="{name}">' + "".join(f'<parameter name="{k}">{v}</parameter>' for k, v in params) + "</invoke>"


WEATHER_TOOL = tool("get_weather", city=S, unit=S)
BOOK_FLIGHT = tool("book_flight", city=S)
READ_FILE = tool("read_file", path=S)
KIMI_ID = "a call id must be functions.NAME:INDEX; vLLM guesses the tool from the arguments"
SCORE = [tool("score", value={"type": "integer"})]
WEATHER_LOC = [tool("get_weather", location=S)]
NULLABLE_OBJ = {"anyOf": [{"type": "object"}, {"type": "null"}]}
SET_TIMER = [tool("set_timer", wait={"anyOf": [
    {"type": "object", "properties": {"type": {"const": "until"}, "date": S}},
    {"type": "object", "properties": {"type": {"const": "for"}, "minutes": {"type": "number"}}}]},
    patches={"oneOf": [{"type": "array", "items": {"type": "object"}}, {"type": "null"}]})]
WRAPPER = "a parameter the tool's schema lacks is a parse error (vLLM unwraps an arguments/input wrapper)"
STR_TRUE = 'string="true" for a parameter whose schema admits no string is a parse error (vLLM converts the text)'
NOT_JSON = 'a string="false" value that is not JSON is a parse error (vLLM keeps the text)'

# pythonic: the calls of vLLM's tests
SIMPLE = "get_weather(city='San Francisco', metric='celsius')"
SIMPLE_C = ("get_weather", {"city": "San Francisco", "metric": "celsius"})
MORE = ("register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, role=None, "
        "passed_test=True, aliases=['John', 'Johnny'])")
MORE_C = ("register_user", {"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"},
                            "role": None, "passed_test": True, "aliases": ["John", "Johnny"]})
ESCAPED = r"get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')"
ESCAPED_C = ("get_weather", {"city": "Martha's Vineyard", "metric": '"cool units"'})
L4_SIMPLE_C = ("get_weather", {"city": "LA", "metric": "C"})
L4_MORE = ("[register_user(name='Doe', age=9, address={'city': 'LA', 'state': 'CA'}, role=None, passed_test=True, "
           "aliases=['John', 'Johnny'])]")
L4_MORE_C = ("register_user", {"name": "Doe", "age": 9, "address": {"city": "LA", "state": "CA"}, "role": None,
                               "passed_test": True, "aliases": ["John", "Johnny"]})
REG_C = ("register_user", {"name": "Doe", "age": 9})
BAD_LITERAL = "an argument with no JSON form is a parse error for its call (vLLM drops that call, keeps the others)"
SYNTAX = "a turn that opens a list of calls but is no Python list is a parse error (vLLM salvages or reads text)"

CASES: list[Case] = [
    # -- kimi_k2 (vLLM: KimiK2ToolParser) -------------------------------------------------------------------------
    Case(("kimi_k2",), KIMI + "test_no_tools", "This is a test", []),
    Case(("kimi_k2",), KIMI + "test_extract_tool_calls[single_tool_call]",
         "I'll check. " + _wrap(_kimi("functions.get_weather:0", '{"city": "Beijing"}')),
         [("get_weather", {"city": "Beijing"})]),
    Case(("kimi_k2",), KIMI + "test_extract_tool_calls[parallel_tool_calls]",
         "Compare weather. " + _wrap(_kimi("functions.get_weather:0", '{"city": "Beijing"}'),
                                     _kimi("functions.get_weather:1", '{"city": "Shanghai"}')),
         [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})]),
    Case(("kimi_k2",), KIMI + "test_extract_tool_calls[three_tool_calls]",
         "Multiple tasks. " + _wrap(_kimi("functions.get_weather:0", '{"city": "New York"}'),
                                    _kimi("functions.get_news:1", '{"topic": "technology"}'),
                                    _kimi("functions.send_email:2",
                                          '{"to": "user@example.com", "subject": "Daily Update"}')),
         [("get_weather", {"city": "New York"}), ("get_news", {"topic": "technology"}),
          ("send_email", {"to": "user@example.com", "subject": "Daily Update"})]),
    Case(("kimi_k2",), KIMI + "test_extract_tool_calls[angle_brackets_in_json]",
         "Process HTML. " + _wrap(_kimi("functions.process_html:0", '{"html": "<div>content</div>"}')),
         [("process_html", {"html": "<div>content</div>"})]),
    Case(("kimi_k2",), KIMI + "test_extract_tool_calls[multiline_json]",
         "Formatted. " + _wrap(_kimi("functions.process_data:0", '{\n  "name": "test",\n  "value": 123\n}')),
         [("process_data", {"name": "test", "value": 123})]),
    Case(("kimi_k2",), KIMI + "test_extract_tool_calls[no_functions_prefix]",
         "No prefix. " + _wrap(_kimi("get_weather:0", '{"city": "Tokyo"}')), [("get_weather", {"city": "Tokyo"})]),
    Case(("kimi_k2",), KIMI + "test_extract_tool_calls[empty_arguments]",
         "Empty args. " + _wrap(_kimi("functions.test:0", "{}")), [("test", {})]),
    Case(("kimi_k2",), KIMI + "test_invalid_json_still_extracted",
         "Help. " + _wrap(_kimi("functions.bad:0", '{"city": "Beijing"'), _kimi("functions.good:1", '{"city": "Shanghai"}')),
         [("bad", '{"city": "Beijing"'), ("good", {"city": "Shanghai"})], [], "stricter",
         "invalid JSON arguments are a parse error for their call (vLLM passes the text on as the arguments)"),
    Case(("kimi_k2",), KIMI + "test_invalid_funcall_id_skipped",
         "Help. " + _wrap(_kimi("functions.invalid.0", '{"city": "Beijing"}'),
                          _kimi("functions.valid:1", '{"city": "Shanghai"}')),
         [("valid", {"city": "Shanghai"})], [], "stricter", "a call id without :INDEX is a parse error (vLLM skips the call)"),
    Case(("kimi_k2",), KIMI + "test_native_id_extracted",
         "Checking weather. " + _wrap(_kimi("functions.get_weather:0", '{"city": "Tokyo"}')),
         [("get_weather", {"city": "Tokyo"})]),
    Case(("kimi_k2",), KIMI + "test_bare_counter",
         "Let me check. " + _wrap(_kimi("0", '{"city": "Tokyo", "unit": "celsius"}')),
         [("get_weather", {"city": "Tokyo", "unit": "celsius"})], [WEATHER_TOOL], "stricter", KIMI_ID),
    Case(("kimi_k2",), KIMI + "test_bare_counter_single_tool_invalid_json_still_extracted",
         "Let me check. " + _wrap(_kimi("0", '{"city": "Tokyo"')), [("get_weather", '{"city": "Tokyo"')],
         [WEATHER_TOOL], "stricter", KIMI_ID),
    Case(("kimi_k2",), KIMI + "test_bare_counter_multiple_tools_infers_by_args",
         "Let me check. " + _wrap(_kimi("0", '{"city": "Tokyo", "unit": "celsius"}')),
         [("get_weather", {"city": "Tokyo", "unit": "celsius"})], [READ_FILE, WEATHER_TOOL], "stricter", KIMI_ID),
    Case(("kimi_k2",), KIMI + "test_bare_counter_multiple_tools_skips_unsafe_inference[ambiguous]",
         "Let me check. " + _wrap(_kimi("0", '{"city": "Tokyo"}')), [], [WEATHER_TOOL, BOOK_FLIGHT], "stricter",
         "a call id must be functions.NAME:INDEX (vLLM drops the call)"),
    Case(("kimi_k2",), KIMI + "test_bare_counter_multiple_tools_skips_unsafe_inference[malformed_json]",
         "Let me check. " + _wrap(_kimi("0", '{"city": "Tokyo"')), [], [WEATHER_TOOL, BOOK_FLIGHT], "stricter",
         "a call id must be functions.NAME:INDEX (vLLM drops the call)"),
    # -- deepseek_v32 (vLLM: DeepSeekV32EngineToolParser) ------------------------------------------------------------
    Case(("deepseek_v32",), DS32 + "test_no_tool_call", "just some text", []),
    Case(("deepseek_v32",), DS32 + "test_single_tool_no_params", f'{FC}\n{INV}get_time">\n{INVE}\n{FCE}',
         [("get_time", {})]),
    Case(("deepseek_v32",), DS32 + "test_single_tool_with_params",
         f'{FC}\n{INV}get_weather">\n{_p("location", "SF")}{_p("date", "2024-01-16")}\n{INVE}\n{FCE}',
         [("get_weather", {"location": "SF", "date": "2024-01-16"})]),
    Case(("deepseek_v32",), DS32 + "test_content_before_tool_call",
         "Sure, let me check! " + f'{FC}\n{INV}get_weather">\n{_p("location", "NYC")}\n{INVE}\n{FCE}',
         [("get_weather", {"location": "NYC"})]),
    Case(("deepseek_v32",), DS32 + "test_no_content_prefix_returns_none",
         f'{FC}\n{INV}get_weather">\n{_p("location", "NYC")}\n{INVE}\n{FCE}', [("get_weather", {"location": "NYC"})]),
    Case(("deepseek_v32",), DS32 + "test_multiple_tools",
         _dsml(("get_weather", [_p("location", "SF")]), ("get_weather", [_p("location", "NYC")])),
         [("get_weather", {"location": "SF"}), ("get_weather", {"location": "NYC"})]),
    Case(("deepseek_v32",), DS32 + "test_type_conversion_in_non_streaming",
         _dsml(("toggle", [_p("enabled", "true", "false"), _p("count", "42", "false")])),
         [("toggle", {"enabled": True, "count": 42})],
         [tool("toggle", enabled={"type": "boolean"}, count={"type": "integer"})]),
    Case(("deepseek_v32",), DS32 + "test_string_attr_true_coerced_by_schema", _dsml(("score", [_p("value", "42")])),
         [("score", {"value": 42})], SCORE, "stricter", STR_TRUE),
    Case(("deepseek_v32",), DS32 + "test_string_attr_false_allows_schema_conversion",
         _dsml(("score", [_p("value", "42", "false")])), [("score", {"value": 42})], SCORE),
    Case(("deepseek_v32",), DS32 + "test_composed_schema_converts_object_and_array_params",
         _dsml(("set_timer", [_p("wait", '{"type":"for","minutes":2880}', "false"),
                              _p("patches", '[{"op":"replace","path":"/schedule","value":"quiet"}]', "false")])),
         [("set_timer", {"wait": {"type": "for", "minutes": 2880},
                         "patches": [{"op": "replace", "path": "/schedule", "value": "quiet"}]})], SET_TIMER),
    Case(("deepseek_v32",), DS32 + "test_string_attr_true_coerced_by_composed_schema",
         _dsml(("set_timer", [_p("wait", '{"type":"for","minutes":2880}')])),
         [("set_timer", {"wait": {"type": "for", "minutes": 2880}})], [tool("set_timer", wait=NULLABLE_OBJ)],
         "stricter", STR_TRUE),
    Case(("deepseek_v32",), DS32 + "test_arguments_wrapper_repaired",
         _dsml(("get_weather", [_p("arguments", '{"location":"Beijing"}', "false")])),
         [("get_weather", {"location": "Beijing"})], WEATHER_LOC, "stricter", WRAPPER),
    Case(("deepseek_v32",), DS32 + "test_input_wrapper_repaired",
         _dsml(("get_weather", [_p("input", '{"location":"Beijing"}')])),
         [("get_weather", {"location": "Beijing"})], WEATHER_LOC, "stricter", WRAPPER),
    Case(("deepseek_v32",), DS32 + "test_object_and_array_params",
         _dsml(("update", [_p("tags", '["a", "b"]', "false"), _p("meta", '{"k": 1}', "false")])),
         [("update", {"tags": ["a", "b"], "meta": {"k": 1}})],
         [tool("update", tags={"type": "array"}, meta={"type": "object"})]),
    Case(("deepseek_v32",), DS32 + "test_number_param",
         _dsml(("measure", [_p("ratio", "3.14", "false"), _p("whole", "5.0", "false")])),
         [("measure", {"ratio": 3.14, "whole": 5})],
         [tool("measure", ratio={"type": "number"}, whole={"type": "number"})]),
    Case(("deepseek_v32",), DS32 + "test_multi_typed_schema",
         _dsml(("set_val", [_p("count", "42", "false"), _p("label", "hello", "false")])),
         [("set_val", {"count": 42, "label": "hello"})],
         [tool("set_val", count={"type": ["integer", "null"]}, label={"type": ["string", "null"]})],
         "stricter", NOT_JSON),
    Case(("deepseek_v32",), DS32 + "test_multi_typed_null_value", _dsml(("clear", [_p("value", "null", "false")])),
         [("clear", {"value": None})], [tool("clear", value={"type": ["integer", "null"]})]),
    Case(("deepseek_v32",), DS32 + "test_null_coerced_back_to_string_by_schema",
         _dsml(("echo", [_p("text", "null", "false")])), [("echo", {"text": "null"})], [tool("echo", text=S)],
         "stricter", "a JSON null for a string-only parameter is a parse error (vLLM turns it back into the text)"),
    Case(("deepseek_v32",), DS32 + "test_no_schema_parses_json",
         _dsml(("unknown_fn", [_p("count", "42", "false"), _p("flag", "true", "false")])),
         [("unknown_fn", {"count": 42, "flag": True})]),
    Case(("deepseek_v32",), DS32S + "test_streaming_matches_non_streaming_conversion_fallbacks",
         _dsml(("coerce", [_p("union_value", "hello", "false"), _p("bad_int", "abc", "false"),
                           _p("nullable_string", "null", "false"), _p("null_string", "null", "false"),
                           _p("whole_number", "3.0", "false")])),
         [("coerce", {"union_value": "hello", "bad_int": "abc", "nullable_string": None, "null_string": "null",
                      "whole_number": 3})],
         [tool("coerce", union_value={"type": ["null", "string"]}, bad_int={"type": "integer"},
               nullable_string={"type": ["null", "string"]}, null_string=S, whole_number={"type": "number"})],
         "stricter", NOT_JSON),
    # -- minimax_m2 (vLLM: MinimaxM2ToolParser; the calls its streaming tests assert) --------------------------------
    Case(("minimax_m2",), MM + "TestContentStreaming::test_plain_content", "Hello world", []),
    Case(("minimax_m2",), MM + "TestContentStreaming::test_content_before_tool_call",
         "Let me check. " + _mm(_inv("get_weather", ("city", "Seattle"))), [("get_weather", {"city": "Seattle"})]),
    Case(("minimax_m2",), MM + "TestSingleInvoke::test_multiple_params",
         _mm(_inv("get_weather", ("city", "Seattle"), ("days", "5"))), [("get_weather", {"city": "Seattle", "days": "5"})]),
    Case(("minimax_m2",), MM + "TestMultipleInvokes::test_two_invokes_incremental",
         _mm(_inv("search_web", ("query", "OpenAI")), _inv("search_web", ("query", "Gemini"))),
         [("search_web", {"query": "OpenAI"}), ("search_web", {"query": "Gemini"})]),
    Case(("minimax_m2",), MM + "TestMultipleInvokes::test_two_invokes_in_single_delta",
         _mm(_inv("fn_a", ("x", "1")), _inv("fn_b", ("y", "2"))), [("fn_a", {"x": "1"}), ("fn_b", {"y": "2"})]),
    Case(("minimax_m2",), MM + "TestMultipleInvokes::test_different_functions",
         _mm(_inv("get_weather", ("city", "NYC")), _inv("get_stock", ("ticker", "AAPL"))),
         [("get_weather", {"city": "NYC"}), ("get_stock", {"ticker": "AAPL"})]),
    Case(("minimax_m2",), MM + "TestInternalState::test_prev_tool_call_arr_single", _mm(_inv("fn", ("a", "1"))),
         [("fn", {"a": "1"})]),
    Case(("minimax_m2",), MM + "TestDeltaMessageFormat::test_tool_call_fields", _mm(_inv("fn", ("k", "v"))),
         [("fn", {"k": "v"})]),
    Case(("minimax_m2",), MM + "TestAnyOfNullableParam::test_anyof_nullable_param_non_null_value",
         _mm(_inv("update_profile", ("nickname", "Alice"))), [("update_profile", {"nickname": "Alice"})],
         [tool("update_profile", nickname={"anyOf": [S, {"type": "null"}]})]),
    Case(("minimax_m2",), MM + "TestAnyOfNullableParam::test_anyof_nullable_param_null_value",
         _mm(_inv("update_profile", ("nickname", "null"))), [("update_profile", {"nickname": None})],
         [tool("update_profile", nickname={"anyOf": [S, {"type": "null"}]})]),
    Case(("minimax_m2",), MM + "TestAnyOfNullableParam::test_anyof_nullable_param_object_value",
         _mm(_inv("update_settings", ("config", '{"theme": "dark", "fontSize": 14}'))),
         [("update_settings", {"config": {"theme": "dark", "fontSize": 14}})],
         [tool("update_settings", config=NULLABLE_OBJ)]),
    # -- pythonic (vLLM: PythonicToolParser) --------------------------------------------------------------------------
    Case(("pythonic",), PY + "test_no_tool_call", "How can I help you today?", []),
    Case(("pythonic",), PY + "test_tool_call[simple_nonstreaming]", f"[{SIMPLE}]", [SIMPLE_C]),
    Case(("pythonic",), PY + "test_tool_call[more_types_nonstreaming]", f"[{MORE}]", [MORE_C]),
    Case(("pythonic",), PY + "test_tool_call[parameterless_nonstreaming]", "[get_weather()]", [("get_weather", {})]),
    Case(("pythonic",), PY + "test_tool_call[empty_dict_nonstreaming]", "[do_something_cool(additional_data={})]",
         [("do_something_cool", {"additional_data": {}})]),
    Case(("pythonic",), PY + "test_tool_call[empty_list_nonstreaming]", "[do_something_cool(steps=[])]",
         [("do_something_cool", {"steps": []})]),
    Case(("pythonic",), PY + "test_tool_call[escaped_string_nonstreaming]", f"[{ESCAPED}]", [ESCAPED_C]),
    Case(("pythonic",), PY + "test_tool_call[parallel_calls_nonstreaming]", f"[{SIMPLE}, {MORE}]", [SIMPLE_C, MORE_C]),
    Case(("pythonic",), PY + "test_bad_sibling_call_does_not_drop_good_calls[False]", f"[bad(x=b'z'), {SIMPLE}]", [SIMPLE_C], [],
         "stricter", BAD_LITERAL),
    Case(("pythonic",), PY + "test_non_finite_argument_rejected", f"[calc(x=1e999), {SIMPLE}]", [SIMPLE_C], [], "stricter",
         BAD_LITERAL),
    Case(("pythonic",), PY + "test_good_call_survives_unparsable_sibling", f"[{SIMPLE}, f(a='x 'y', b='z')]", [SIMPLE_C], [],
         "stricter", SYNTAX),
    Case(("pythonic",), PY + "test_unrecoverable_block_still_reports_no_tool_call", "[f(a='x 'y' 'z), g(b='p 'q' 'r)]", [], [],
         "stricter", SYNTAX),
    # -- llama4_pythonic (vLLM: Llama4PythonicToolParser) ---------------------------------------------------------------
    Case(("llama4_pythonic",), L4 + "test_no_tool_call", "How can I help you today?", []),
    Case(("llama4_pythonic",), L4 + "test_tool_call[simple_nonstreaming]", "[get_weather(city='LA', metric='C')]",
         [L4_SIMPLE_C]),
    Case(("llama4_pythonic",), L4 + "test_tool_call[more_types_nonstreaming]", L4_MORE, [L4_MORE_C]),
    Case(("llama4_pythonic",), L4 + "test_tool_call[parameterless_nonstreaming]", "[get_weather()]",
         [("get_weather", {})]),
    Case(("llama4_pythonic",), L4 + "test_tool_call[empty_dict_nonstreaming]",
         "[do_something_cool(additional_data={})]", [("do_something_cool", {"additional_data": {}})]),
    Case(("llama4_pythonic",), L4 + "test_tool_call[empty_list_nonstreaming]", "[do_something_cool(steps=[])]",
         [("do_something_cool", {"steps": []})]),
    Case(("llama4_pythonic",), L4 + "test_tool_call[escaped_string_nonstreaming]", f"[{ESCAPED}]", [ESCAPED_C]),
    Case(("llama4_pythonic",), L4 + "test_tool_call[parallel_calls_nonstreaming0]",
         "[get_weather(city='LA',metric='C'),register_user(name='Doe',age=9)]", [L4_SIMPLE_C, REG_C]),
    Case(("llama4_pythonic",), L4 + "test_tool_call[python_tag_nonstreaming]",
         "<|python_start|>[get_weather(city='LA', metric='C')]<|python_end|>", [L4_SIMPLE_C]),
    Case(("llama4_pythonic",), L4 + "test_tool_call[parallel_calls_nonstreaming1]",
         "<|python_start|>[get_weather(city='LA', metric='C'), register_user(name='Doe', age=9)]",
         [L4_SIMPLE_C, REG_C]),
    Case(("llama4_pythonic",), L4 + "test_bad_sibling_call_does_not_drop_good_calls[False]",
         "<|python_start|>[bad(x=b'z'), get_weather(city='LA', metric='C')]<|python_end|>", [L4_SIMPLE_C], [],
         "stricter", BAD_LITERAL),
    Case(("llama4_pythonic",), L4 + "test_non_finite_argument_rejected",
         "<|python_start|>[calc(x=1e999), get_weather(city='LA', metric='C')]<|python_end|>", [L4_SIMPLE_C], [],
         "stricter", BAD_LITERAL),
]
