"""vLLM's non-streaming cases for ``hermes``, ``qwen3_xml`` (its common tests), ``deepseek_v3``, ``deepseek_v31``,
``mistral``, ``glm45`` / ``glm47`` and ``gemma4``."""

from __future__ import annotations

from tests.vllm_cases.base import Case, tool

S = {"type": "string"}
HERMES = "test_hermes_tool_parser.py::"
XML = "test_qwen3xml_tool_parser.py::TestQwen3xmlToolParser::"
DS3 = "test_deepseekv3_tool_parser.py::TestDeepSeekV3ToolParser::"
DS31 = "test_deepseekv31_tool_parser.py::"
MISTRAL = "test_mistral_tool_parser.py::"
GLM = "test_glm4_moe_tool_parser.py::"
GLM47 = "test_glm47_moe_tool_parser.py::TestGlm47ExtractToolCalls::"
GEMMA = "test_gemma4_tool_parser.py::TestExtractToolCalls::"
H = ("hermes", "qwen")
G45 = ("glm45", "glm47")

# DeepSeek's markers
CB, CE, B, E, SEP = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _ds3(name: str, args: str) -> str:
    return f"{B}function{SEP}{name}\n```json\n{args}\n```{E}"


def _glm(name: str, *pairs: tuple[str, str], sep: str = "\n") -> str:
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in pairs)
    return f"<tool_call>{name}{sep}{body}</tool_call>"


def _gm(name: str, args: str) -> str:
    return f"<|tool_call>call:{name}{{{args}}}<tool_call|>"


Q = '<|"|>'
WEATHER = {"city": "San Francisco", "state": "CA", "unit": "celsius"}
GLM_TOOLS = [tool("get_weather", city=S)]
GLM47_TOOLS = [{"type": "function", "function": {"name": "get_current_date", "parameters": {}}},
               tool("get_weather", city=S, date=S)]
FUNCTION_TOOLS = [tool("get_weather", city=S, unit=S),
                  tool("calculate", operation=S, a={"type": "number"}, b={"type": "number"})]
TRUNCATED = "a call cut before its end is a parse error (vLLM recovers it)"
NO_CALL = "text that opens a call but holds none is a parse error (vLLM reads it as text)"

CASES: list[Case] = [
    # -- hermes (vLLM: Hermes2ProToolParser) ---------------------------------------------------------------------------
    Case(H, HERMES + "test_hermes_parser_non_streaming_no_tool_call", "This is not a tool call.", []),
    Case(H, HERMES + "test_hermes_parser_non_streaming_tool_call_between_tags",
         '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>',
         [("final_answer", {"trigger": True})]),
    Case(H, HERMES + "test_hermes_parser_non_streaming_tool_call_until_eos",
         '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}', [("final_answer", {"trigger": True})],
         [], "stricter", "a <tool_call> not closed by </tool_call> is a parse error (vLLM reads to the end)"),
    Case(H, HERMES + "test_hermes_parser_non_streaming_tool_call_invalid_json",
         '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}', [], [], "stricter", NO_CALL),
    Case(H, HERMES + "test_hermes_parser_non_streaming_serialized_arguments",
         '<tool_call>\n{"name": "get_db_config", "arguments": "{\\"param\\": \\"max_connections\\"}"}\n</tool_call>',
         [("get_db_config", {"param": "max_connections"})], [], "stricter",
         '"arguments" must be a JSON object; vLLM also accepts a string holding one'),
    Case(H, HERMES + "test_hermes_parser_non_streaming_bare_string_arguments",
         '<tool_call>\n{"name": "do_thing", "arguments": "hello"}\n</tool_call>', [("do_thing", "hello")], [],
         "stricter", '"arguments" must be a JSON object; vLLM passes the string "hello" on as the arguments'),
    # -- qwen3_xml: vLLM's common tests (no tools given: every value stays text) --------------------------------------
    Case(("qwen3_xml",), XML + "test_no_tool_calls", "This is a regular response without any tool calls.", []),
    Case(("qwen3_xml",), XML + "test_single_tool_call_simple_args",
         "<tool_call>\n<function=get_weather>\n<parameter=city>Tokyo</parameter>\n</function>\n</tool_call>",
         [("get_weather", {"city": "Tokyo"})]),
    Case(("qwen3_xml",), XML + "test_parallel_tool_calls",
         "<tool_call>\n<function=get_weather>\n<parameter=city>Tokyo</parameter>\n</function>\n</tool_call>"
         "<tool_call>\n<function=get_time>\n<parameter=timezone>Asia/Tokyo</parameter>\n</function>\n</tool_call>",
         [("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})]),
    Case(("qwen3_xml",), XML + "test_various_data_types",
         "<tool_call>\n<function=test_function>\n<parameter=string_field>hello</parameter>\n"
         "<parameter=int_field>42</parameter>\n<parameter=float_field>3.14</parameter>\n"
         "<parameter=bool_field>true</parameter>\n<parameter=null_field>null</parameter>\n"
         '<parameter=array_field>["a", "b", "c"]</parameter>\n<parameter=object_field>{"nested": "value"}</parameter>\n'
         "</function>\n</tool_call>",
         [("test_function", {"string_field": "hello", "int_field": "42", "float_field": "3.14", "bool_field": "true",
                             "null_field": "null", "array_field": '["a", "b", "c"]',
                             "object_field": '{"nested": "value"}'})]),
    Case(("qwen3_xml",), XML + "test_empty_arguments", "<tool_call>\n<function=refresh>\n</function>\n</tool_call>",
         [("refresh", {})]),
    Case(("qwen3_xml",), XML + "test_surrounding_text",
         "Let me check the weather for you.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>Tokyo</parameter>\n"
         "</function>\n</tool_call>\n\nI will get that information.", [("get_weather", {"city": "Tokyo"})]),
    Case(("qwen3_xml",), XML + "test_escaped_strings",
         '<tool_call>\n<function=test_function>\n<parameter=quoted>He said "hello"</parameter>\n'
         "<parameter=path>C:\\Users\\file.txt</parameter>\n<parameter=newline>line1\nline2</parameter>\n"
         "</function>\n</tool_call>",
         [("test_function", {"quoted": 'He said "hello"', "path": "C:\\Users\\file.txt", "newline": "line1\nline2"})]),
    # -- deepseek_v3: vLLM's common tests -------------------------------------------------------------------------------
    Case(("deepseek_v3",), DS3 + "test_no_tool_calls", "How can I help you today? I can check weather for you.", []),
    Case(("deepseek_v3",), DS3 + "test_single_tool_call_simple_args",
         CB + _ds3("get_weather", '{"city": "Tokyo", "unit": "celsius"}') + CE,
         [("get_weather", {"city": "Tokyo", "unit": "celsius"})]),
    Case(("deepseek_v3",), DS3 + "test_parallel_tool_calls",
         CB + _ds3("get_weather", '{"city": "Tokyo", "unit": "celsius"}')
         + _ds3("search_hotels", '{"location": "Tokyo", "check_in": "2025-01-15"}') + CE,
         [("get_weather", {"city": "Tokyo", "unit": "celsius"}),
          ("search_hotels", {"location": "Tokyo", "check_in": "2025-01-15"})]),
    Case(("deepseek_v3",), DS3 + "test_various_data_types",
         CB + _ds3("test_function", '{"string_field": "hello", "int_field": 42, "float_field": 3.14, "bool_field": true, '
                   '"null_field": null, "array_field": ["a", "b", "c"], "object_field": {"nested": "value"}, '
                   '"empty_array": [], "empty_object": {}}') + CE,
         [("test_function", {"string_field": "hello", "int_field": 42, "float_field": 3.14, "bool_field": True,
                             "null_field": None, "array_field": ["a", "b", "c"], "object_field": {"nested": "value"},
                             "empty_array": [], "empty_object": {}})]),
    Case(("deepseek_v3",), DS3 + "test_empty_arguments", CB + _ds3("get_current_time", "{}") + CE,
         [("get_current_time", {})]),
    Case(("deepseek_v3",), DS3 + "test_surrounding_text",
         "Let me check the weather for you." + CB + _ds3("get_weather", '{"city": "Paris"}') + CE,
         [("get_weather", {"city": "Paris"})]),
    Case(("deepseek_v3",), DS3 + "test_escaped_strings",
         CB + _ds3("send_message", '{"text": "He said \\"hello\\"", "path": "C:\\\\Users\\\\file", '
                   '"newline": "line1\\nline2"}') + CE,
         [("send_message", {"text": 'He said "hello"', "path": "C:\\Users\\file", "newline": "line1\nline2"})]),
    *[Case(("deepseek_v3",), DS3 + f"test_malformed_input[{i}]", text, [], [], "stricter", why)
      for i, (text, why) in enumerate([
          (CB + _ds3("get_weather", '{"city": "Tokyo"') + CE, "invalid JSON arguments are a parse error (vLLM: no call)"),
          (f'{CB}function{SEP}get_weather\n```json\n{{"city": "Tokyo"}}\n```{CE}',
           "a calls section without a call is a parse error (vLLM: no call)")])],
    # -- deepseek_v31 ----------------------------------------------------------------------------------------------------
    Case(("deepseek_v31",), DS31 + "test_extract_tool_calls_with_tool",
         f'normal text{CB}{B}foo{SEP}{{"x":1}}{E}{CE}', [("foo", {"x": 1})]),
    Case(("deepseek_v31",), DS31 + "test_extract_tool_calls_with_multiple_tools",
         f'some prefix text{CB}{B}foo{SEP}{{"x":1}}{E}{B}bar{SEP}{{"y":2}}{E}{CE} some suffix text',
         [("foo", {"x": 1}), ("bar", {"y": 2})]),
    Case(("deepseek_v31",), DS31 + "test_extract_tool_calls_unparsable_block[cut]",
         f"Let me look that up.{CB}get_weather", [], [], "stricter", NO_CALL),
    Case(("deepseek_v31",), DS31 + "test_extract_tool_calls_unparsable_block[no_call_markers]",
         f'{CB}foo{SEP}{{"x":1}}{CE}', [], [], "stricter", NO_CALL),
]

NO_ARGS_TOKEN = ("a v11+ call is NAME[ARGS]{...} (the [ARGS] control token its templates write); NAME directly "
                 "followed by the JSON, as in vLLM's test text, is a parse error")
PRE11 = MISTRAL + "test_extract_tool_calls_pre_v11_tokenizer"
V11 = MISTRAL + "test_extract_tool_calls"
ADD = '{"name": "add", "arguments":{"a": 3.5, "b": 4}}'
SF = '{"name": "get_current_weather", "arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}}'
BASH = '{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')"'
BASH_ARGS = {"command": "print(\"hello world!\")\nre.compile(r'{}')"}

CASES += [
    # -- mistral ---------------------------------------------------------------------------------------------------------
    *[Case(("mistral",), MISTRAL + f"test_extract_tool_calls_no_tools[{v}]", "This is a test", [])
      for v in ("pre_v11", "v11")],
    Case(("mistral",), PRE11 + "[single_tool_add]", f"[TOOL_CALLS][{ADD}]", [("add", {"a": 3.5, "b": 4})]),
    Case(("mistral",), PRE11 + "[single_tool_weather]", f"[TOOL_CALLS] [{SF}]", [("get_current_weather", WEATHER)]),
    Case(("mistral",), PRE11 + "[argument_before_name]",
         '[TOOL_CALLS] [{"arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}, '
         '"name": "get_current_weather"}]', [("get_current_weather", WEATHER)]),
    Case(("mistral",), PRE11 + "[argument_before_name_and_name_in_argument]",
         '[TOOL_CALLS] [{"arguments":{"name": "John Doe"}, "name": "get_age"}]', [("get_age", {"name": "John Doe"})]),
    Case(("mistral",), PRE11 + "[multiple_tools]",
         f'[TOOL_CALLS] [{{"name": "add", "arguments": {{"a": 3.5, "b": 4}}}}, {SF}]',
         [("add", {"a": 3.5, "b": 4}), ("get_current_weather", WEATHER)]),
    Case(("mistral",), PRE11 + "[content_before_tool]", 'Hello[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]',
         [("add", {"a": 1, "b": 2})]),
    Case(("mistral",), PRE11 + "[trailing_data_after_json]",
         '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":{"city": "Dallas", "state": "TX", '
         '"unit": "fahrenheit"}}]\nextra trailing data',
         [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})], [], "stricter",
         "text after the JSON list of calls is a parse error (vLLM drops it)"),
    Case(("mistral",), MISTRAL + "test_extract_tool_calls_pre_v11_multiple_bot_tokens_raises",
         '[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1}}][TOOL_CALLS] [{"name": "sub", "arguments":{"b": 2}}]',
         [], [], "stricter", "vLLM raises on a second [TOOL_CALLS] before a JSON list (no call); toolgym reports it"),
    Case(("mistral",), MISTRAL + "test_extract_tool_calls_pre_v11_regex_fallback",
         '[TOOL_CALLS]  junk [{"name": "add", "arguments":{"a": 1, "b": 2}}] trail', [("add", {"a": 1, "b": 2})], [],
         "stricter", "text around the JSON list is a parse error (vLLM searches the text for a list)"),
    Case(("mistral",), MISTRAL + "test_extract_tool_calls_pre_v11_regex_fallback_fails", "[TOOL_CALLS] not json at all",
         [], [], "stricter", NO_CALL),
    Case(("mistral",), V11 + "[single_tool_add]", '[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}',
         [("add_this_and_that", {"a": 3.5, "b": 4})], [], "stricter", NO_ARGS_TOKEN),
    Case(("mistral",), V11 + "[single_tool_weather]",
         '[TOOL_CALLS]get_current_weather{"city": "San Francisco", "state": "CA", "unit": "celsius"}',
         [("get_current_weather", WEATHER)], [], "stricter", NO_ARGS_TOKEN),
    Case(("mistral",), V11 + "[multiple_tool_calls]", '[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}',
         [("add", {"a": 3.5, "b": 4}), ("multiply", {"a": 3, "b": 6})], [], "stricter", NO_ARGS_TOKEN),
    Case(("mistral",), V11 + "[complex]", f"hi{{hi[TOOL_CALLS]bash{BASH}",
         [("bash", '{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')')], [], "stricter",
         NO_ARGS_TOKEN + "; the arguments are also cut (vLLM passes the cut JSON text on)"),
    Case(("mistral",), V11 + "[wrong_json]", f"hi{{hi[TOOL_CALLS]bash{BASH}}}", [("bash", BASH_ARGS)], [], "stricter",
         NO_ARGS_TOKEN),
    Case(("mistral",), MISTRAL + "test_extract_tool_calls_v11_without_args_skipped", "[TOOL_CALLS]toolname_no_args", [],
         [], "stricter", "a call without arguments is a parse error (vLLM drops it)"),
    # -- glm45 (vLLM: Glm4MoeModelToolParser) ------------------------------------------------------------------------------
    Case(("glm45",), GLM + "test_extract_tool_calls_no_tools", "This is a test", [], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls[single_tool_call]",
         _glm("get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit"), sep="\n    "),
         [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls[multiple_tool_calls]",
         _glm("get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit"), sep="\n    ")
         + "\n    " + _glm("get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit"),
                          sep="\n    "),
         [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}),
          ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls[tool_call_with_content_before]",
         "I'll help you check the weather. "
         + _glm("get_current_weather", ("city", "Seattle"), ("state", "WA"), ("unit", "celsius"), sep="\n    "),
         [("get_current_weather", {"city": "Seattle", "state": "WA", "unit": "celsius"})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls[tool_call_with_mixed_args]",
         _glm("get_current_weather", ("city", "New York"), ("state", "NY"), ("unit", "celsius"), sep="\n    "),
         [("get_current_weather", {"city": "New York", "state": "NY", "unit": "celsius"})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls[tool_call_with_chinese_content]",
         "I will help you get the weather."
         + _glm("get_weather", ("city", "Beijing"), ("date", "2025-08-01"), sep="\n    "),
         [("get_weather", {"city": "Beijing", "date": "2025-08-01"})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls_with_thinking_tags",
         "<think>I want to get the weather.</think>\n\nI will help you get the weather.\n"
         + _glm("get_weather", ("city", "Beijing"), ("date", "2025-08-01")),
         [("get_weather", {"city": "Beijing", "date": "2025-08-01"})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls_empty_arguments", "<tool_call>get_current_time\n</tool_call>",
         [("get_current_time", {})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls_mixed_content",
         "I will help you get the weather info.\n\n" + _glm("get_weather", ("city", "Beijing"), ("date", "2025-08-01"))
         + "\n\nmeaningwhile, I will also check the weather in Shanghai.\n\n"
         + _glm("get_weather", ("city", "Shanghai"), ("date", "2025-08-01")),
         [("get_weather", {"city": "Beijing", "date": "2025-08-01"}),
          ("get_weather", {"city": "Shanghai", "date": "2025-08-01"})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls_special_characters",
         _glm("send_message", ("recipient", "Amy"), ("message", "It is a nice day"), ("priority", "high")),
         [("send_message", {"recipient": "Amy", "message": "It is a nice day", "priority": "high"})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls_incomplete_tool_call",
         _glm("get_weather", ("city", "Beijing"), ("date", "2025-08-01")).removesuffix("\n</tool_call>"), [], GLM_TOOLS,
         "stricter", "a <tool_call> not closed by </tool_call> is a parse error (vLLM reads it as text)"),
    Case(("glm45",), GLM + "test_extract_tool_calls_numeric_deserialization",
         _glm("calculate", ("operation", "add"), ("a", "42"), ("b", "3.14"), ("enabled", "true")),
         [("calculate", {"operation": "add", "a": 42, "b": 3.14, "enabled": True})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_whitespace_preserved_in_arg_values", _glm("apply_diff", ("s", "    indented code    ")),
         [("apply_diff", {"s": "    indented code    "})], [tool("apply_diff", s=S)]),
    Case(("glm45",), GLM + "test_zero_argument_tool_call", "<tool_call>get_time\n</tool_call>", [("get_time", {})],
         GLM_TOOLS),
    Case(("glm45",), GLM + "test_malformed_tool_call_no_regex_match", "<tool_call>   ", [], GLM_TOOLS, "stricter",
         "a <tool_call> not closed by </tool_call> is a parse error (vLLM reads it as text)"),
    Case(("glm45",), GLM + "test_unicode_characters_preserved",
         _glm("send_message", ("greeting", "你好世界"), ("emoji", "🎉")),
         [("send_message", {"greeting": "你好世界", "emoji": "🎉"})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls_with_function_tool",
         _glm("get_weather", ("city", "Dallas"), ("unit", "fahrenheit")),
         [("get_weather", {"city": "Dallas", "unit": "fahrenheit"})], FUNCTION_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_calls_with_function_tool_mixed_types",
         _glm("calculate", ("operation", "add"), ("a", "42"), ("b", "3.14")),
         [("calculate", {"operation": "add", "a": 42, "b": 3.14})], FUNCTION_TOOLS),
    Case(("glm45",), GLM + "test_extract_tool_call_without_newline_after_name",
         _glm("get_weather", ("city", "Seattle"), sep=""), [("get_weather", {"city": "Seattle"})], GLM_TOOLS),
    Case(("glm45",), GLM + "test_string_type_detection_with_list_types", _glm("log", ("message", "test message"), sep=""),
         [("log", {"message": "test message"})], [tool("log", message={"type": ["string", "null"]})]),
    # -- glm47 (vLLM: Glm47MoeModelToolParser) -----------------------------------------------------------------------------
    Case(("glm47",), GLM47 + "test_no_tool_call", "This is a plain response.", [], GLM47_TOOLS),
    *[Case(("glm47",), GLM47 + test, text, calls, GLM47_TOOLS) for test, text, calls in [
        ("test_zero_arg_inline", "<tool_call>get_current_date</tool_call>", [("get_current_date", {})]),
        ("test_zero_arg_newline", "<tool_call>get_current_date\n</tool_call>", [("get_current_date", {})]),
        ("test_args_same_line", _glm("get_weather", ("city", "Beijing"), sep=""), [("get_weather", {"city": "Beijing"})]),
        ("test_args_with_newlines", _glm("get_weather", ("city", "Beijing")), [("get_weather", {"city": "Beijing"})]),
        ("test_content_before", "Checking.<tool_call>get_current_date</tool_call>", [("get_current_date", {})]),
        ("test_multiple", _glm("get_weather", ("city", "Beijing"), sep="") + _glm("get_weather", ("city", "Shanghai"), sep=""),
         [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})]),
        ("test_empty_content_none", "<tool_call>get_current_date</tool_call>", [("get_current_date", {})]),
        ("test_whitespace_content_none", "  \n  <tool_call>get_current_date</tool_call>", [("get_current_date", {})]),
    ]],
    # -- gemma4 --------------------------------------------------------------------------------------------------------------
    Case(("gemma4",), GEMMA + "test_no_tool_calls", "Hello, how can I help you today?", []),
    *[Case(("gemma4",), GEMMA + test, text, calls) for test, text, calls in [
        ("test_single_tool_call", _gm("get_weather", f"location:{Q}London{Q}"), [("get_weather", {"location": "London"})]),
        ("test_multiple_arguments", _gm("get_weather", f"location:{Q}San Francisco{Q},unit:{Q}celsius{Q}"),
         [("get_weather", {"location": "San Francisco", "unit": "celsius"})]),
        ("test_text_before_tool_call", "Let me check the weather for you. " + _gm("get_weather", f"location:{Q}Paris{Q}"),
         [("get_weather", {"location": "Paris"})]),
        ("test_multiple_tool_calls", _gm("get_weather", f"location:{Q}London{Q}") + _gm("get_time", f"location:{Q}London{Q}"),
         [("get_weather", {"location": "London"}), ("get_time", {"location": "London"})]),
        ("test_nested_arguments", _gm("complex_function", f"nested:{{inner:{Q}value{Q}}},list:[{Q}a{Q},{Q}b{Q}]"),
         [("complex_function", {"nested": {"inner": "value"}, "list": ["a", "b"]})]),
        ("test_tool_call_with_number_and_boolean", _gm("set_status", "is_active:true,count:42,score:3.14"),
         [("set_status", {"is_active": True, "count": 42, "score": 3.14})]),
        ("test_hyphenated_function_name", _gm("get-weather", f"location:{Q}London{Q}"),
         [("get-weather", {"location": "London"})]),
        ("test_dotted_function_name", _gm("weather.get", f"location:{Q}London{Q}"),
         [("weather.get", {"location": "London"})]),
        ("test_no_arguments", _gm("get_status", ""), [("get_status", {})]),
    ]],
    Case(("gemma4",), GEMMA + "test_incomplete_tool_call", f"<|tool_call>call:get_weather{{location:{Q}London", [], [],
         "stricter", "a <|tool_call> not closed by <tool_call|> is a parse error (vLLM reads it as text)"),
]

CONF = "test_format_conformance.py::test_documented_format_is_extracted"
QWEN_SF = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSF\n</parameter>\n</function>\n</tool_call>"
SF_CALL = [("get_weather", {"city": "SF"})]
CASES += [
    Case(H, CONF + "[hermes]", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "SF"}}\n</tool_call>', SF_CALL),
    Case(("mistral",), CONF + "[mistral]", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "SF"}}]', SF_CALL),
    Case(("mistral",), CONF + "[mistral_v11]", '[TOOL_CALLS]get_weather{"city": "SF"}', SF_CALL, [], "stricter",
         NO_ARGS_TOKEN),
    Case(("qwen3_xml",), CONF + "[qwen3_xml]", QWEN_SF, SF_CALL),
    Case(("qwen3_coder",), CONF + "[qwen3_coder]", QWEN_SF, SF_CALL),
    Case(("deepseek_v3",), CONF + "[deepseek_v3]", CB + _ds3("get_weather", '{"city": "SF"}') + CE, SF_CALL),
    Case(("glm45",), CONF + "[glm4_moe]", _glm("get_weather", ("city", "SF")), SF_CALL),
]
