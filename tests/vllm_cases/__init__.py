"""vLLM's own non-streaming tool-parser test cases, as data: the model output, the tools vLLM was given, and the
calls vLLM's parser of the same name returns (read from its tests and its parser code), each with toolgym's
expected reading of the same text (``tests/test_vllm_parity.py`` checks every one).

Facts only (inputs and vLLM's results), written here as data; no vLLM code or prose. ``SOURCES`` names the vLLM
commit each test file was read at (repository ``vllm-project/vllm``, directory ``tests/tool_parsers/``; the
files' newest versions in the search index this work used, 2026-11). Tests that assert no result for an input
(only "does not raise") are not ported: there is no vLLM reading to compare with.
"""

from __future__ import annotations

from tests.vllm_cases.base import Case
from tests.vllm_cases.hermes_deepseek_mistral_glm_gemma import CASES as _HDMGG
from tests.vllm_cases.kimi_deepseek32_minimax_pythonic import CASES as _KDMP
from tests.vllm_cases.qwen_llama_openai import CASES as _QLO

__all__ = ["CASES", "SOURCES", "Case"]

SOURCES = {
    "test_qwen3_xml_coder_shared.py": "00d0a333ba9b8e40eb35fc0b54b4ae96114f30b3",
    "test_qwen3coder_tool_parser.py": "049d8df27dda4fd0caffa289ea12bfe5a47ac794",
    "test_qwen3xml_tool_parser.py": "1cbe721380ab9295854e4db1e819c40b14c54828",
    "test_qwen36_bugs.py": "c164555e412e3a867d3fcfb40033020fe879596d",
    "test_llama3_json_tool_parser.py": "1e499e36c5828a75c6ca8b76631d264be1187005",
    "test_openai_tool_parser.py": "15c99cb111e626d885d7f54a0b57dc9ff10168db",
    "test_hermes_tool_parser.py": "0eb73d6a09be117cdd0d4da4d6239321001c0d0c",
    "test_deepseekv3_tool_parser.py": "0f17ee061e413bf8ab7927f926f69cdff24dc63e",
    "test_deepseekv31_tool_parser.py": "100fe7e0c14678963aafa5e53001099f761e0f26",
    "test_mistral_tool_parser.py": "002d5731d3ee99b92d80b103be81c212245f1acf",
    "test_glm4_moe_tool_parser.py": "024364d6695352f41c029121af6b8ecf2ae60184",
    "test_glm47_moe_tool_parser.py": "0ce879769db6d7503db0ecdfb5b503b080720347",
    "test_gemma4_tool_parser.py": "027004de3715411197be51ced325705abcf740a7",
    "test_format_conformance.py": "0e4c702aa688590f5d68af44c0dd2d0cf0430b01",
    "test_kimi_k2_tool_parser.py": "0825a6c362795d1643ce5684bb3cfa26ff6ffed2",
    "test_deepseekv32_tool_parser.py": "00816550e740a13736f7ef9921097d51a3f01ede",
    "test_minimax_m2_tool_parser.py": "0c927c3451653f28e60cd552cff13ddc3c9ff49e",
    "test_pythonic_tool_parser.py": "0716d268c7d81e445bd9ae30205f7bf4cfacd7d5",
    "test_llama4_pythonic_tool_parser.py": "0716d268c7d81e445bd9ae30205f7bf4cfacd7d5",
}

CASES: list[Case] = [*_QLO, *_HDMGG, *_KDMP]
