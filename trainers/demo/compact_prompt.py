"""A compact tool prompt for small models on small machines (used by ``make demo``).

toolgym's ChatML tool template (:func:`toolgym.models.chatml_tools_template`) lists every tool as its full JSON
schema plus a paragraph on the call format: ~250 of the ~290 prompt tokens of a Calculator-v0 episode. On a CPU,
prefill of those tokens dominates every rollout and evaluation (``docs/training.md`` measures it). :func:`compact_tools_template` renders the same conversation with each tool on one line
(``- name(arg, ...): description``) and a one-line call example; everything else (turn framing, ``<tool_call>``
blocks, ``<tool_response>`` turns) is the ChatML tool template unchanged, so the env's parser and masks work as is.

Use the same template for training and evaluation: pass it as the env's ``chat_template`` and save it with a
checkpoint's tokenizer (:func:`save_checkpoint` does), so ``toolgym.models.load_model(DIR)`` and any env built
with that tokenizer render the same prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["COMPACT_SYSTEM_PROMPT", "compact_tools_template", "save_checkpoint"]

#: The demo's short Calculator-v0 system prompt (same instruction as the env's default, fewer tokens).
COMPACT_SYSTEM_PROMPT = "Call the calculator, then reply <answer>RESULT</answer>."

_COMPACT_TOOLS = (
    '{%- if tools -%}\n'
    '{{- "<|im_start|>system\\n" + system_text + "\\nTools:" -}}\n'
    '  {%- for t in tools -%}\n'
    '    {%- set f = t.function if t.function is defined else t -%}\n'
    '{{- "\\n- " + f.name + "(" + ((f.parameters.properties | list) | join(", ")) + "): " + f.description -}}\n'
    '  {%- endfor -%}\n'
    '{{- "\\nCall: <tool_call>\\n{\\"name\\": ..., \\"arguments\\": {...}}\\n</tool_call><|im_end|>\\n" -}}\n'
    '{%- elif'
)


def compact_tools_template() -> str:
    """toolgym's ChatML tool template with the tool list rendered compactly (one line per tool)."""
    from toolgym.models import chatml_tools_template

    full = chatml_tools_template()
    start = full.index("{%- if tools -%}")
    end = full.index("{%- elif", start)
    return full[:start] + _COMPACT_TOOLS + full[end + len("{%- elif"):]


def save_checkpoint(model: Any, tokenizer: Any, path: str | Path, *, chat_template: str | None = None,
                    run_settings: Mapping[str, Any] | None = None) -> Path:
    """Save ``model`` and a copy of ``tokenizer`` (with ``chat_template`` if given) in Hugging Face format, so
    ``toolgym.models.load_model(path)`` loads both. The shared tokenizer object is not mutated.

    ``run_settings``: keyword arguments of :func:`toolgym.checkpoint.write_run_settings` (``env_id``,
    ``env_kwargs`` such as the system prompt and chat template, ``max_turn_tokens``, ``eval``), written as
    ``toolgym_run.json`` so ``toolgym eval --policy path`` renders the prompt the model was trained on."""
    import copy

    from toolgym.checkpoint import write_run_settings

    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(p), safe_serialization=True)
    tok = copy.deepcopy(tokenizer)
    if chat_template is not None:
        tok.chat_template = chat_template
    tok.save_pretrained(str(p))
    if run_settings is not None:
        write_run_settings(p, **run_settings)
    return p
