"""Vision-language training from ``toolgym train`` and config files: a tiny Qwen2.5-VL saved with its image-only
processor, trained by ``toolgym train sft`` (masked, the oracle's episodes of ``toolgym/Chart-v0``) and
``toolgym train grpo`` with ``env_kwargs.processor: true``; the processor loader's image-only fallback and its
classified errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.vision_models import processor, tiny_model
from toolgym.checkpoint import read_run_settings
from toolgym.format.vision import family_of
from toolgym.models import load_model
from toolgym.processors import (
    ProcessorNotFoundError,
    UnsupportedProcessorError,
    is_vision_checkpoint,
    load_processor,
)

pytest.importorskip("trl", reason="toolgym train needs the [train] extra (trl)")

from trainers import cli  # noqa: E402

FAMILY = "qwen2_5_vl"


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2.5-VL and its image-only processor, saved as a checkpoint directory."""
    d = tmp_path_factory.mktemp("tiny_qwen2_5_vl")
    tiny_model(FAMILY).save_pretrained(str(d))
    processor(FAMILY).save_pretrained(str(d))
    return d


def _torchvision_loads() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or its operators fail to load on a CPU-only torch
        return False
    return True


def test_load_processor_falls_back_to_the_image_only_processor(vlm_dir, caplog):
    import torch

    with caplog.at_level(logging.INFO, logger="toolgym.processors"):
        proc = load_processor(vlm_dir)
    assert family_of(proc).name == FAMILY
    if not _torchvision_loads():  # the situation on a CPU-only install: the full processor cannot be built
        assert "image-only processor" in caplog.text and "Qwen2_5_VLProcessor" in caplog.text
        assert type(proc).get_attributes() == ["image_processor", "tokenizer"]
    # the loaded processor expands an image as the one it was saved from
    from PIL import Image as PILImage

    img = PILImage.new("RGB", (100, 60), (10, 20, 30))
    text = ["<|vision_start|><|image_pad|><|vision_end|>"]
    ref = processor(FAMILY)(text=text, images=[img], return_tensors="pt")
    got = proc(text=text, images=[img], return_tensors="pt")
    assert got["input_ids"].tolist() == ref["input_ids"].tolist() and got["input_ids"].shape[1] == 8 + 2
    assert torch.equal(got["pixel_values"], ref["pixel_values"])
    assert load_processor(str(vlm_dir)) is proc  # memoised: the env's and the trainer's processor are one object
    model, tok = load_model(vlm_dir)
    assert is_vision_checkpoint(vlm_dir) and type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert tok is proc.tokenizer


def test_processor_errors_are_classified(tmp_path):
    with pytest.raises(ProcessorNotFoundError, match="no such directory"):
        load_processor(tmp_path / "missing")
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ProcessorNotFoundError, match=r"has no processor_config\.json"):
        load_processor(tmp_path / "text")
    assert not is_vision_checkpoint(tmp_path / "text")
    odd = tmp_path / "odd"  # a processor config of a family that cannot be built here and has no fallback
    odd.mkdir()
    (odd / "processor_config.json").write_text(json.dumps({"processor_class": "NoSuchVLProcessor"}))
    with pytest.raises(UnsupportedProcessorError, match="NoSuchVLProcessor"):
        load_processor(odd)


def test_a_processor_for_a_text_model_is_a_config_error(capsys, tmp_path):
    rc = cli.main(["sft", "--toolgym.model", "tiny", "--toolgym.env_id", "toolgym/Chart-v0", "--toolgym.update",
                   "masked", "--toolgym.env_kwargs", "{processor: true}", "--toolgym.episodes", "1",
                   "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--report_to", "[]"])
    err = capsys.readouterr().err
    assert rc == 2 and "env_kwargs.processor: model tiny is text-only" in err, err


def _image_token_rows(rows: list[dict], image_token_id: int) -> list[int]:
    """Per row: the image tokens among its ids, each checked to carry loss mask 0."""
    out = []
    for r in rows:
        ids, mask = r["prompt_ids"] + r["completion_ids"], [0] * len(r["prompt_ids"]) + r["loss_mask"]
        assert all(m == 0 for i, m in zip(ids, mask, strict=True) if i == image_token_id)
        out.append(sum(i == image_token_id for i in ids))
    return out


@pytest.mark.slow
def test_sft_masked_trains_a_vlm_from_a_config_file_and_saves_its_processor(vlm_dir, tmp_path, capsys):
    import torch

    out = tmp_path / "sft"
    cfg = tmp_path / "sft_vl.yaml"
    cfg.write_text(f"toolgym:\n  model: {vlm_dir}\n  env_id: toolgym/Chart-v0\n"
                   "  env_kwargs: {split: train, processor: true}\n  update: masked\n  episodes: 2\n  num_envs: 2\n"
                   "  threads: 1\n"
                   f"output_dir: {out}\nmax_steps: 1\nper_device_train_batch_size: 2\nlearning_rate: 1.0e-2\n"
                   "use_cpu: true\nreport_to: []\nsave_strategy: 'no'\n")
    assert cli.main(["sft", "--config", str(cfg)]) == 0, capsys.readouterr().err
    assert "kept 2 (reward >= 1.0)" in capsys.readouterr().out  # the oracle read the zoomed pixels
    proc = load_processor(vlm_dir)
    rows = [json.loads(ln) for ln in (out / "sft_trajectories.jsonl").read_text().splitlines()]
    counts = _image_token_rows(rows, proc.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    assert len(rows) == 2 and all(c > 0 for c in counts) and all(r["images"] for r in rows)
    # the checkpoint: weights, its processor and run settings naming it; the vision tower was trained (the
    # forward had the pixels: a forward reading image tokens as text leaves the vision tower without gradient)
    assert (out / "processor_config.json").is_file()
    assert read_run_settings(out)["env_kwargs"] == {"processor": True}
    trained, tok = load_model(out)
    reloaded = load_processor(out)
    assert family_of(reloaded).name == FAMILY and tok is reloaded.tokenizer
    before = tiny_model(FAMILY).model.visual.patch_embed.proj.weight
    assert not torch.equal(before, trained.model.visual.patch_embed.proj.weight)
    # `toolgym rollout --policy DIR` of the checkpoint: its run settings' processor is the checkpoint's own
    from toolgym.cli import main as toolgym_main

    assert toolgym_main(["rollout", "Chart-v0", "--policy", str(out), "--episodes", "1", "--max-new-tokens", "4",
                         "--out", str(tmp_path / "reload.jsonl")]) == 0
    (row,) = [json.loads(ln) for ln in (tmp_path / "reload.jsonl").read_text().splitlines()]
    assert _image_token_rows([row], tok.convert_tokens_to_ids("<|image_pad|>"))[0] > 0


@pytest.mark.slow
def test_grpo_trains_a_vlm_from_the_command_line(vlm_dir, tmp_path, capsys):
    out, traj = tmp_path / "grpo", tmp_path / "traj"
    rc = cli.main(["grpo", "--toolgym.model", str(vlm_dir), "--toolgym.env_id", "toolgym/Chart-v0",
                   "--toolgym.env_kwargs", "{split: train, processor: auto, max_turns: 1}",
                   "--toolgym.num_train_tasks", "2", "--toolgym.max_turn_tokens", "4", "--toolgym.threads", "1",
                   "--toolgym.trajectory_dir", str(traj), "--max_steps", "1", "--per_device_train_batch_size", "2",
                   "--num_generations", "2", "--max_completion_length", "16", "--beta", "0.0",
                   "--output_dir", str(out), "--use_cpu", "true", "--report_to", "[]", "--save_strategy", "'no'",
                   "--logging_steps", "1", "--bf16", "false",
                   "--toolgym.validation_tasks", "1", "--toolgym.validation_every", "1"])
    assert rc == 0, capsys.readouterr().err
    assert f"done, model saved to {out}" in capsys.readouterr().out
    assert (out / "best" / "processor_config.json").is_file()  # the best step reloads with its processor too
    proc = load_processor(vlm_dir)
    rows = [json.loads(ln) for f in sorted(traj.glob("*.jsonl")) for ln in f.read_text().splitlines()]
    counts = _image_token_rows(rows, proc.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    assert len(rows) == 2 and all(c > 0 for c in counts)  # the chart, as image tokens, in every trained episode
    assert (out / "processor_config.json").is_file()
    assert read_run_settings(out)["env_kwargs"] == {"processor": True, "max_turns": 1}
    model, tok = load_model(out)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration" and tok is load_processor(out).tokenizer
