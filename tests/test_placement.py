"""toolgym.placement: ``--device`` resolved once, models moved there in the dtype the device computes in."""

from __future__ import annotations

import pytest
import torch

from toolgym.placement import DeviceError, describe, place, placement_dtype, resolve_device


def test_auto_is_the_gpu_only_when_torch_sees_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda:0")
    assert resolve_device("CUDA") == torch.device("cuda:0") and resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(DeviceError, match="torch sees 2 CUDA"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "mps:0", ""])
def test_anything_else_is_a_classified_error(spec, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if spec == "":  # empty = auto
        assert resolve_device(spec) == torch.device("cpu")
        return
    with pytest.raises(DeviceError, match="expected auto, cpu, cuda or cuda:N"):
        resolve_device(spec)


def test_bfloat16_on_a_gpu_that_has_it_else_the_loaded_dtype(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert placement_dtype(torch.device("cuda:0"), torch.float32) is torch.bfloat16
    assert placement_dtype(torch.device("cpu"), torch.float32) is torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert placement_dtype(torch.device("cuda:0"), torch.float32) is torch.float32


def test_place_on_the_cpu_states_device_and_dtype():
    model = torch.nn.Linear(3, 2).to(torch.float64)
    placed, text = place(model, "cpu")
    assert text == "model on cpu, float64" == describe(placed) and placed.weight.dtype is torch.float64
