# isort: skip_file
"""Tool-call parsers of the model families, one module each (or per group).

Each is registered under the name vLLM's ``--tool-call-parser`` uses for the same format (facts taken from vLLM's
tool parsers and the families' chat templates; no code copied). Like every parser, ``parse`` never raises: a
malformed call becomes a :class:`~toolgym.tools.base.ToolCall` with ``parse_error`` set.

===================  =====================================================================================
name                 format (what the model writes)
===================  =====================================================================================
``qwen3_coder``      ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``
                     (Qwen3-Coder, Qwen3.5+); alias ``qwen3_xml``. Values are text, converted with the tool's
                     JSON schema; tags inside values told from real ones by it (module ``qwen3_coder``).
``deepseek_v3``      ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>``
``deepseek_v31``     V3.1's variant: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``.
``openai``           GPT-OSS harmony: messages ``[<|start|>assistant]HEADER<|message|>BODY<|end|>|<|call|>|<|return|>``;
                     a call is a message to ``functions.NAME`` (recipient in the template's place,
                     `` to=functions.NAME<|channel|>commentary json``, or channel-first, ``<|channel|>commentary
                     to=functions.NAME <|constrain|>json``); alias ``harmony``.
``mistral``          ``[TOOL_CALLS]NAME[ARGS]{...}`` (v11+; ``[CALL_ID]ID`` before ``[ARGS]`` accepted) or
                     ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (pre-v11).
``glm45``            ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>`` (GLM-4.5/4.6/4.7).
``gemma4``           ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>`` (Gemma 4).
``kimi_k2``          ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>…<|tool_calls_section_end|>``
``deepseek_v32``     ``<｜DSML｜function_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter name="K" string="true">V</｜DSML｜parameter>…``
                     (DeepSeek-V3.2; ``string="false"``: a JSON value).
``minimax_m2``       ``<minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter></invoke></minimax:tool_call>``;
                     values stripped and typed with the tool's JSON schema as vLLM's MiniMax-M2 parser reads them.
``pythonic``         ``[NAME(key='text', n=3), ...]`` (Llama 3.2 / Llama 4, optionally in ``<|python_start|>``); read with
                     :mod:`ast`, literals only; alias ``llama4_pythonic``.
===================  =====================================================================================
``hermes``           ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen 2.5/3); alias ``qwen``.
``llama3_json``      ``{"name": ..., "parameters": {...}}`` (Llama 3.1+); alias ``llama3``.

Importing this package registers them in this order (``parser="auto"`` tries the last registered first): hermes,
llama3_json, qwen3_coder, deepseek_v31, deepseek_v3, mistral, glm45, gemma4, openai, kimi_k2, deepseek_v32,
minimax_m2, pythonic.
"""

from __future__ import annotations

# the order of registration is the order of these imports (ruff's import sorting is off for this file)
from toolgym.format.families.hermes import HermesParser
from toolgym.format.families.llama3 import Llama3JsonParser
from toolgym.format.families.qwen3_coder import Qwen3CoderParser
from toolgym.format.families.deepseek import DeepSeekV31Parser, DeepSeekV3Parser
from toolgym.format.families.mistral import MistralParser
from toolgym.format.families.glm import Glm45Parser
from toolgym.format.families.gemma import Gemma4Parser
from toolgym.format.families.harmony import HarmonyParser
from toolgym.format.families.kimi import KimiK2Parser
from toolgym.format.families.dsml import DeepSeekV32Parser
from toolgym.format.families.minimax import MiniMaxM2Parser
from toolgym.format.families.pythonic import PythonicParser

__all__ = [
    "DeepSeekV3Parser",
    "DeepSeekV31Parser",
    "DeepSeekV32Parser",
    "Gemma4Parser",
    "Glm45Parser",
    "HarmonyParser",
    "HermesParser",
    "KimiK2Parser",
    "Llama3JsonParser",
    "MiniMaxM2Parser",
    "MistralParser",
    "PythonicParser",
    "Qwen3CoderParser",
]
