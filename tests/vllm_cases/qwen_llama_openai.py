"""vLLM's non-streaming cases for ``qwen3_coder`` / ``qwen3_xml``, ``llama3_json`` and ``openai`` (harmony)."""

from __future__ import annotations

from tests.vllm_cases.base import Case, tool

S = {"type": "string"}
QWEN = ("qwen3_coder", "qwen3_xml")
SHARED = "test_qwen3_xml_coder_shared.py::"
CODER = "test_qwen3coder_tool_parser.py::"
LLAMA = "test_llama3_json_tool_parser.py::"
OPENAI = "test_openai_tool_parser.py::"

WEATHER_AREA = [
    tool("get_current_weather", city=S, state=S, unit={"type": "string", "enum": ["fahrenheit", "celsius"]}),
    tool("calculate_area", shape=S, dimensions={"type": "object"}, precision={"type": "integer"}),
]
TYPES = [tool("test_types", int_param={"type": "integer"}, float_param={"type": "float"},
              bool_param={"type": "boolean"}, str_param=S, obj_param={"type": "object"})]
WRITE_FILE = [tool("write_file", path=S, content=S)]
NULLABLE = {"anyOf": [{"type": "string"}, {"type": "null"}]}
NULLABLE_INT = {"anyOf": [{"type": "integer"}, {"type": "null"}]}


def _q(name: str, *params: tuple[str, str], nl: bool = True) -> str:
    """A Qwen3-Coder call block; ``nl``: values on their own lines (the template's layout)."""
    sep = "\n" if nl else ""
    body = "".join(f"<parameter={k}>{sep}{v}{sep}</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


DALLAS = _q("get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit"))
DALLAS_ARGS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
ORLANDO = _q("get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit"))
XML_TAGS_IN_CONTENT = ('char_deltas = [\n    "<tool_call>\\n",\n    "<parameter=query>\\n",\n'
                       '    "\\n</parameter>\\n",\n    "</function>\\n",\n]\n')
PARAM_LIKE_LINES = 'TOOL_CALL_TEMPLATE = """\n</parameter>\n<parameter=new_string>\n#!/usr/bin/env python3\n</parameter>\n"""\n'
REAL_NAME_LITERAL = 'doc = """\n<parameter=path>\nliteral/value\n</parameter>\n"""\n'
FULL_NESTED = ('doc = """\n<tool_call>\n<function=write_file>\n<parameter=path>\nliteral/value.txt\n</parameter>\n'
               '<parameter=content>\nhello\n</parameter>\n</function>\n</tool_call>\n"""\n')
OUT_OF_SCHEMA = 'template = """\n<tool_call>\n<function=foo>\n<parameter=bar>baz</parameter>\n</function>\n</tool_call>\n"""\n'


def _wf(path: str, content: str) -> str:
    return ("<tool_call>\n<function=write_file>\n"
            f"<parameter=path>\n{path}\n</parameter>\n<parameter=content>\n{content}</parameter>\n"
            "</function>\n</tool_call>\n")


CASES: list[Case] = [
    # -- qwen3_coder / qwen3_xml: the tests both vLLM parsers share ---------------------------------------------
    Case(QWEN, SHARED + "test_extract_tool_calls_no_tools", "This is a test response without any tool calls", [],
         WEATHER_AREA),
    Case(QWEN, SHARED + "test_extract_tool_calls[single_tool]", DALLAS, [("get_current_weather", DALLAS_ARGS)],
         WEATHER_AREA),
    Case(QWEN, SHARED + "test_extract_tool_calls[single_tool_with_content]",
         "Sure! Let me check the weather for you." + DALLAS, [("get_current_weather", DALLAS_ARGS)], WEATHER_AREA),
    Case(QWEN, SHARED + "test_extract_tool_calls[single_tool_multiline_param]",
         _q("calculate_area", ("shape", "rectangle"), ("dimensions", '{"width": 10,\n "height": 20}'), ("precision", "2")),
         [("calculate_area", {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2})],
         WEATHER_AREA),
    Case(QWEN, SHARED + "test_extract_tool_calls[parallel_tools]", DALLAS + "\n" + ORLANDO,
         [("get_current_weather", DALLAS_ARGS),
          ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})], WEATHER_AREA),
    Case(QWEN, SHARED + "test_extract_tool_calls[tool_with_typed_params]",
         "Let me calculate that area for you."
         + _q("calculate_area", ("shape", "circle"), ("dimensions", '{"radius": 15.5}'), ("precision", "3")),
         [("calculate_area", {"shape": "circle", "dimensions": {"radius": 15.5}, "precision": 3})], WEATHER_AREA),
    Case(QWEN, SHARED + "test_extract_tool_calls_fallback_no_tags",
         "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n"
         "</parameter>\n</function>", [("get_current_weather", {"city": "Dallas", "state": "TX"})], WEATHER_AREA,
         "text", "no <tool_call> block: Qwen's templates always write one, so a bare <function=...> is the answer's text"),
    Case(QWEN, SHARED + "test_extract_tool_calls_type_conversion",
         _q("test_types", ("int_param", "42"), ("float_param", "3.14"), ("bool_param", "true"),
            ("str_param", "hello world"), ("obj_param", '{"key": "value"}')),
         [("test_types", {"int_param": 42, "float_param": 3.14, "bool_param": True, "str_param": "hello world",
                          "obj_param": {"key": "value"}})], TYPES),
    Case(QWEN, SHARED + "test_extract_tool_calls_complex_type_with_single_quote",
         _q("test_types", ("obj_param", "{'key': 'value'}")), [("test_types", {"obj_param": {"key": "value"}})], TYPES),
    Case(QWEN, SHARED + "test_extract_tool_calls_missing_closing_parameter_tag",
         "Let me check the weather for you:\n<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n"
         "<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>",
         [("get_current_weather", DALLAS_ARGS)], WEATHER_AREA, "stricter",
         "a <parameter=...> not closed by </parameter> is a parse error (vLLM ends the value at the next parameter)"),
    Case(QWEN, SHARED + "test_malformed_xml_no_gt_delimiter",
         "<tool_call>\n<function=get_current_weather\n<parameter=city>Dallas</parameter>\n</function>\n</tool_call>",
         [], WEATHER_AREA, "stricter", "vLLM drops the call silently; toolgym reports the malformed name"),
    Case(QWEN, SHARED + "test_none_tool_calls_filtered",
         "<tool_call>\n<function=bad_func_no_gt\n</function>\n</tool_call>\n"
         + _q("get_current_weather", ("city", "Dallas"), ("state", "TX"), nl=False),
         [("get_current_weather", {"city": "Dallas", "state": "TX"})], WEATHER_AREA, "stricter",
         "vLLM drops the malformed first call silently; toolgym reports it (and makes the second call)"),
    Case(QWEN, SHARED + "test_no_double_serialization_string_args",
         _q("greet", ("message", "hello world"), nl=False), [("greet", {"message": "hello world"})],
         [tool("greet", message=S)]),
    Case(QWEN, SHARED + "test_string_null_value_preserved", _q("search", ("query", "null"), nl=False),
         [("search", {"query": "null"})], [tool("search", query=S)]),
    Case(QWEN, SHARED + "test_anyof_string_null_keeps_value_as_string", _q("set_code", ("code", "42"), nl=False),
         [("set_code", {"code": "42"})], [tool("set_code", code=NULLABLE)]),
    Case(QWEN, SHARED + "test_anyof_integer_null_parses_as_int", _q("set_count", ("count", "42"), nl=False),
         [("set_count", {"count": 42})], [tool("set_count", count=NULLABLE_INT)]),
    Case(QWEN, SHARED + "test_anyof_object_param_not_double_encoded_nonstreaming",
         _q("update_record", ("data", '{"key": "value", "count": 42}'), nl=False),
         [("update_record", {"data": {"key": "value", "count": 42}})],
         [tool("update_record", data={"anyOf": [{"type": "object"}, {"type": "null"}]})]),
    Case(QWEN, SHARED + "test_double_encoded_object_param_nonstreaming",
         _q("process", ("name", "hello"), ("data", "\"{'key': 'value', 'n': 1}\"")) + "\n",
         [("process", {"name": "hello", "data": {"key": "value", "n": 1}})],
         [tool("process", name=S, data={"type": "object"})]),
    Case(QWEN, SHARED + "test_content_with_xml_structural_tags_nonstreaming", _wf("test.py", XML_TAGS_IN_CONTENT),
         [("write_file", {"path": "test.py", "content": XML_TAGS_IN_CONTENT.rstrip("\n")})], WRITE_FILE),
    Case(QWEN, SHARED + "test_content_with_param_like_lines_nonstreaming", _wf("test_template.py", PARAM_LIKE_LINES),
         [("write_file", {"path": "test_template.py", "content": PARAM_LIKE_LINES.rstrip("\n")})], WRITE_FILE),
    Case(QWEN, SHARED + "test_array_with_json_bool", _q("pick", ("items", '["a", "b", 1, true]')),
         [("pick", {"items": ["a", "b", 1, True]})], [tool("pick", items={"type": "array"})]),
    Case(QWEN, SHARED + "test_python_none_value_for_nullable_int", _q("set_count", ("count", "None"), nl=False),
         [("set_count", {"count": None})], [tool("set_count", count=NULLABLE_INT)]),
    Case(QWEN, SHARED + "test_content_with_real_param_name_literal_nonstreaming",
         _wf("fixture.py", REAL_NAME_LITERAL).rstrip("\n"),
         [("write_file", {"path": "fixture.py", "content": REAL_NAME_LITERAL.rstrip("\n")})], WRITE_FILE),
    Case(QWEN, SHARED + "test_content_with_full_nested_tool_call_nonstreaming",
         _wf("fixture.py", FULL_NESTED).rstrip("\n"),
         [("write_file", {"path": "fixture.py", "content": FULL_NESTED.rstrip("\n")})], WRITE_FILE),
    Case(QWEN, SHARED + "test_two_tools_second_with_out_of_schema_nested_literal_nonstreaming",
         _q("foo", ("bar", "baz"), nl=False) + "\n\n" + _wf("fixture.py", OUT_OF_SCHEMA).rstrip("\n"),
         [("foo", {"bar": "baz"}), ("write_file", {"path": "fixture.py", "content": OUT_OF_SCHEMA.rstrip("\n")})],
         WRITE_FILE),
    Case(QWEN, SHARED + "test_jinja_template_phantom_tool_call_is_rejected_nonstreaming",
         "<tool_call>\n<function={{ tc.name }}>\n<parameter={{ k }}>\n{{ v }}\n</parameter>\n</function>\n</tool_call>"
         "\n\n" + _q("write_file", ("path", "out.txt"), ("content", "hello")),
         [("write_file", {"path": "out.txt", "content": "hello"})], WRITE_FILE, "stricter",
         "vLLM drops the unrendered-template call silently; toolgym reports it (and makes the real call)"),
    Case(QWEN, SHARED + "test_inline_empty_tool_call_preserves_content_before_real_call",
         "I'll show: <tool_call>example</tool_call>. Now real:\n" + _q("log", ("msg", "hi")),
         [("log", {"msg": "hi"})], [tool("log", msg=S)], "stricter",
         "a <tool_call> block without <function=NAME> is a parse error (vLLM ignores it)"),
    *[Case(QWEN, SHARED + f"test_anyof_string_null_with_null_literal_returns_none[{lit}]",
           _q("set_value", ("optional", lit), nl=False), [("set_value", {"optional": None})],
           [tool("set_value", optional=NULLABLE)]) for lit in ("null", "None")],
    # -- qwen3_coder only ------------------------------------------------------------------------------------------
    Case(("qwen3_coder",), CODER + "test_extract_tool_calls_anyof_type_conversion",
         _q("test_anyof", ("anyof_int", "5"), ("anyof_str", "hello"), ("anyof_array", '["a", "b", "c"]'),
            ("anyof_obj", '{"key": "value"}'), ("type_as_array", "42"), ("multi_non_null", "some text")),
         [("test_anyof", {"anyof_int": 5, "anyof_str": "hello", "anyof_array": ["a", "b", "c"],
                          "anyof_obj": {"key": "value"}, "type_as_array": 42, "multi_non_null": "some text"})],
         [tool("test_anyof", anyof_int={**NULLABLE_INT, "default": 5}, anyof_str=NULLABLE,
               anyof_array={"anyOf": [{"type": "array", "items": S}, {"type": "null"}]},
               anyof_obj={"anyOf": [{"type": "object"}, {"type": "null"}]}, type_as_array={"type": ["integer", "null"]},
               multi_non_null={"anyOf": [S, {"type": "integer"}, {"type": "null"}]})]),
    Case(("qwen3_coder",), CODER + "test_extract_tool_calls[parallel_tools]", DALLAS + "\n" + ORLANDO,
         [("get_current_weather", DALLAS_ARGS),
          ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})], WEATHER_AREA),
    *[Case((name,), f"test_qwen36_bugs.py::test_{kind}_array_with_json_bool_nonstreaming",
           _q("pick", ("items", '["a", "b", 1, true]')), [("pick", {"items": ["a", "b", 1, True]})],
           [tool("pick", items={"type": "array"})]) for name, kind in (("qwen3_xml", "xml"), ("qwen3_coder", "coder"))],
    # -- llama3_json -------------------------------------------------------------------------------------------------
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_simple",
         'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you like to know more?',
         [("getOpenIncidentsTool", {})], [], "text",
         "Llama 3's call is the whole message (after an optional <|python_tag|>); JSON inside prose is the answer"),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_with_arguments",
         '{"name": "searchTool", "parameters": {"query": "test query", "limit": 10}}',
         [("searchTool", {"query": "test query", "limit": 10})]),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_no_json", "This is just some text without any tool calls", []),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_invalid_json",
         '{"name": "invalidTool", "parameters": {invalid json}', [], [], "stricter",
         "a message that starts with { must be calls: invalid JSON is a parse error (vLLM reads it as text)"),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_with_arguments_key",
         '{"name": "searchTool", "arguments": {"query": "test"}}', [("searchTool", {"query": "test"})]),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_multiple_json",
         '{"name": "searchTool", "parameters": {"query": "test1"}}; {"name": "getOpenIncidentsTool", "parameters": {}}; '
         '{"name": "searchTool", "parameters": {"query": "test2"}}',
         [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"})]),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_multiple_json_with_whitespace",
         '{"name": "searchTool", "parameters": {"query": "test1"}} ; {"name": "getOpenIncidentsTool", "parameters": {}} ; '
         '{"name": "searchTool", "parameters": {"query": "test2"}}',
         [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"})]),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_multiple_json_with_surrounding_text",
         'Here are the results: {"name": "searchTool", "parameters": {"query": "test1"}}; '
         '{"name": "getOpenIncidentsTool", "parameters": {}}; {"name": "searchTool", "parameters": {"query": "test2"}} '
         "Would you like to know more?",
         [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"})], [],
         "text", "Llama 3's calls are the whole message; JSON inside prose is the answer"),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_deeply_nested_json",
         '{"name": "complexTool", "parameters": {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}}}',
         [("complexTool", {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}})]),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_multiple_with_deep_nesting",
         '{"name": "simpleTool", "parameters": {"value": "test"}}; {"name": "complexTool", "parameters": '
         '{"config": {"database": {"connection": {"pool": {"size": 10}}}}}}',
         [("simpleTool", {"value": "test"}),
          ("complexTool", {"config": {"database": {"connection": {"pool": {"size": 10}}}}})]),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_with_quotes_and_brackets_in_string",
         '{"name": "searchTool", "parameters": {"query": "test {value} [complex]","nested": {"inner": "more {brackets}"}}}',
         [("searchTool", {"query": "test {value} [complex]", "nested": {"inner": "more {brackets}"}})]),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_with_escaped_quotes_in_nested_json",
         '{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\""}}',
         [("parserTool", {"text": 'He said "Hello {world}"'})]),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_missing_name_key", '{"parameters": {}}', [], [], "stricter",
         "an object without a name is a parse error (vLLM reads it as text)"),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_missing_parameters_and_arguments_key",
         '{"name": "toolWithoutParams"}', [], [], "stricter",
         'an object without "parameters"/"arguments" is a parse error (vLLM reads it as text)'),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_brace_in_trailing_text",
         '{"name": "searchTool", "parameters": {"query": "test"}} I used {searchTool} for this.',
         [("searchTool", {"query": "test"})], [], "stricter",
         "text after the calls is a parse error (vLLM drops it); the call itself is made"),
    Case(("llama3_json",), LLAMA + "test_extract_tool_calls_json_fragment_in_trailing_text",
         '{"name": "searchTool", "parameters": {"query": "test"}} The arguments I passed were {"query": "test"}',
         [("searchTool", {"query": "test"})], [], "stricter",
         "text after the calls is a parse error (vLLM drops it); the call itself is made"),
    Case(("llama3_json",), LLAMA + "test_regex_timeout_handling", "{hello world[A(A=" + "\t)A(A=,\t" * 2, [], [],
         "stricter", "a message that starts with { must be calls: invalid JSON is a parse error (vLLM: text)"),
    # -- openai (harmony): the assistant text after the prompt's <|start|>assistant, as harmony renders it --------------
    Case(("openai",), OPENAI + "test_extract_tool_calls_no_tools", "<|channel|>final<|message|>This is a test<|end|>", []),
    *[Case(("openai",), OPENAI + f"test_extract_tool_calls_single_tool[{i}]",
           '<|channel|>analysis<|message|>User asks: "What is the weather in Tokyo?" We need to use get_current_weather '
           "tool.<|end|><|start|>assistant to=functions.get_current_weather<|channel|>commentary <|constrain|>json"
           f"<|message|>{args}<|call|>", [("get_current_weather", {"location": "Tokyo"})])
      for i, args in enumerate(('{"location": "Tokyo"}', '{\n"location": "Tokyo"\n}'))],
    Case(("openai",), OPENAI + "test_extract_tool_calls_multiple_tools",
         '<|channel|>analysis<|message|>User asks: "What is the weather in Tokyo?" based on their location.<|end|>'
         '<|start|>assistant to=functions.get_current_weather<|channel|>commentary <|constrain|>json<|message|>'
         '{"location": "Tokyo"}<|call|>'
         '<|start|>assistant to=functions.get_user_location<|channel|>commentary <|constrain|>json<|message|>'
         '{"location": "Tokyo"}<|call|>'
         '<|start|>assistant to=functions.no_content_type<|channel|>commentary<|message|>{"location": "Tokyo"}<|call|>'
         "<|start|>assistant to=functions.not_json_no_content_type<|channel|>commentary<|message|>foo<|call|>"
         "<|start|>assistant to=functions.empty_args<|channel|>commentary <|constrain|>json<|message|>{}<|call|>"
         "<|start|>assistant to=functions.no_args<|channel|>commentary <|constrain|>json<|message|><|call|>",
         [("get_current_weather", {"location": "Tokyo"}), ("get_user_location", {"location": "Tokyo"}),
          ("no_content_type", {"location": "Tokyo"}), ("not_json_no_content_type", "foo"), ("empty_args", {}),
          ("no_args", "")], [], "stricter",
         "a call whose body is not a JSON object (`foo`, or nothing) is a parse error; vLLM passes the text on as "
         "the arguments string"),
    Case(("openai",), OPENAI + "test_extract_tool_calls_with_content",
         '<|channel|>analysis<|message|>User asks about the weather.<|end|>'
         '<|start|>assistant to=functions.get_current_weather<|channel|>commentary <|constrain|>json<|message|>'
         '{"location": "Tokyo"}<|call|><|start|>assistant<|channel|>final<|message|>This tool call will get the weather.'
         "<|end|>", [("get_current_weather", {"location": "Tokyo"})]),
]
