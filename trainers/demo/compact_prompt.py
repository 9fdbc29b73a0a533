"""A compact tool prompt for small models on small machines (used by ``make demo``).

toolgym's ChatML tool template (:func:`toolgym.models.chatml_tools_template`) lists every tool as its full JSON
schema plus a paragraph on the call format: ~250 of the ~290 prompt tokens of a Calculator-v0 episode. On a CPU,
prefill of those tokens dominates every rollout and evaluation (``docs/training.md`` measures it). :func:`compact_tools_template` renders the same conversation with each tool on one line
(``- name(arg, ...): description``) and a one-line call example; everything else (turn framing, ``<tool_call>``
blocks, ``<tool_response>`` turns) is the ChatML tool template unchanged, so the env's parser and masks work as is.

Use the same template for training and evaluation: pass it as the env's ``chat_template`` and save it with a
checkpoint's tokenizer (:func:`toolgym.checkpoint.save_checkpoint` does), so ``toolgym.models.load_model(DIR)`` and any env built
with that tokenizer render the same prompt.
"""

from __future__ import annotations

__all__ = ["COMPACT_SYSTEM_PROMPT", "compact_tools_template"]

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
