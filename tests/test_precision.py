"""What a run says it computes in: the CPU's bfloat16 units read from its flags, and the line the demo prints."""

from __future__ import annotations

import pytest

from toolgym.precision import cpu_bf16_units, describe_precision

INTEL_AMX = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
AMD_ZEN4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
OLD_CPU = "processor\t: 0\nflags\t\t: fpu sse2 avx2\n"


def test_bf16_units_are_read_from_the_cpu_flags() -> None:
    assert cpu_bf16_units(INTEL_AMX) == ["AMX", "AVX512-BF16"]
    assert cpu_bf16_units(AMD_ZEN4) == ["AVX512-BF16"]
    assert cpu_bf16_units(OLD_CPU) == []
    assert cpu_bf16_units("") == []


def test_the_precision_line_names_the_dtype_and_why() -> None:
    amd = describe_precision("cpu", "float32", "bfloat16", cpu_bf16_units(AMD_ZEN4))
    assert amd.startswith("float32 weights, bfloat16 autocast") and "AVX512-BF16" in amd and "AMX" not in amd
    intel = describe_precision("cpu", "float32", "bfloat16", cpu_bf16_units(INTEL_AMX))
    assert "AMX and AVX512-BF16" in intel
    old = describe_precision("cpu", "float32", "bfloat16", cpu_bf16_units(OLD_CPU))
    assert "emulated" in old and "bf16: false" in old
    assert describe_precision("cpu", "float32", None) == "float32 weights, no autocast (every product in float32)"
    assert describe_precision("cuda", "float32", "bfloat16").endswith("(cuda)")
    with pytest.raises(ValueError, match="autocast must be one of"):
        describe_precision("cpu", "float32", "int8")
