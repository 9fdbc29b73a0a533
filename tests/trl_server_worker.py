"""One rank of the emulated GPU path (run by tests/test_gpu_emulation.py under ``accelerate launch``): TRL 1.16's
``GRPOTrainer`` in vLLM **server** mode through the toolgym adapter, against ``TrainableModelServer``.

What is emulated and how: vLLM is not installed, so a stub ``vllm`` package (made by the test, first on
``PYTHONPATH``) lets TRL import; TRL's own ``VLLMClient`` talks HTTP to the stand-in server; the one CUDA-only
part, the NCCL group and broadcast of the weights (``init_communicator`` / ``update_named_params``), is replaced
below by HTTP (the same announcements, then a safetensors body). Everything else is TRL's and DeepSpeed's code.

Rank 0's episodes call the calculator on their first turn (injected: a random model never does; those injected
tokens carry NaN logprobs, which TRL excludes), so rank 0 plays 2 turns while rank 1 plays 1. The reward is the
last completion token id mod 5 (a random model earns none, and without advantages the weights would never move).

Args (argv): OUT_DIR SERVER_URL SKIP_PUSH_FROM_STEP (-1: always push) MAX_STEPS BETA
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

OUT, URL, SKIP_FROM, MAX_STEPS, BETA = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
TRAINER = None
PUSHES: list[int] = []


def _install_http_weight_transfer() -> None:
    """Replace the NCCL parts of TRL's VLLMClient with HTTP (see the module docstring)."""
    from safetensors.torch import save
    from trl.generation.vllm_client import VLLMClient

    def init_communicator(self, device=0):
        if self.get_server_info()["weight_transfer_config"] is None:
            raise RuntimeError("no weight-transfer engine")
        info = {"backend": "http", "rank_offset": 1, "world_size": self.get_world_size() + 1}
        self._post(f"{self.base_url}/init_weight_transfer_engine", json={"init_info": info})
        self.communicator = "http"

    def update_named_params(self, metadata, named_params):
        tensors = {n: t.detach().to("cpu").clone().contiguous() for n, t in named_params}  # drains ZeRO-3 gathers
        step = TRAINER.state.global_step
        if 0 <= SKIP_FROM <= step:
            return  # fault injection: a run that forgets to push the weights
        names, dtypes, shapes = (list(f) for f in zip(*metadata, strict=True))
        if not self._updating_weights:
            self._start_weight_update()
        self._post(f"{self.base_url}/update_weights",
                   json={"update_info": {"names": names, "dtype_names": dtypes, "shapes": shapes}})
        self._post(f"{self.base_url}/update_weights/tensors", data=save(tensors))
        if not self._updating_weights:
            self._finish_weight_update()
        PUSHES.append(step)

    VLLMClient.init_communicator = init_communicator
    VLLMClient.update_named_params = update_named_params


def main() -> None:
    global TRAINER
    from trl import GRPOConfig

    from toolgym.envs.calculator import generate_task
    from toolgym.models import load_tokenizer, tiny_random_model
    from trainers.grpo import Config, build_trainer

    _install_http_weight_transfer()
    rank = int(os.environ.get("RANK", "0"))
    rng = np.random.default_rng(3)
    tasks = [generate_task(rng) for _ in range(4)]
    tok = load_tokenizer()
    args = GRPOConfig(
        output_dir=OUT, per_device_train_batch_size=4, num_generations=4, max_completion_length=64, max_steps=MAX_STEPS,
        logging_steps=1, report_to=[], save_strategy="no", seed=0, disable_tqdm=True, bf16=False,
        learning_rate=3e-3, beta=BETA, temperature=1.0, use_vllm=True, vllm_mode="server", vllm_server_base_url=URL,
        vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate",
    )
    trainer, rollout = build_trainer(Config(max_turn_tokens=12, trl=args), model=tiny_random_model(tok, seed=0),
                                     tokenizer=tok, tasks=tasks)
    TRAINER = trainer
    real = trainer._generate_single_turn
    calls: list[int] = []

    def wrapped(prompt_ids, images, mm, n, **kw):
        ids, lps = real(prompt_ids, images, mm, n, **kw)
        if rank == 0 and not calls:  # rank 0's episodes call the tool on their first turn of each step
            envs = rollout.venv.envs

            def call(i: int) -> list[int]:
                env = envs[i].unwrapped
                text = env.format.parser.format_calls([("calculator", {"expression": env.task["expression"]})])
                return [int(x) for x in env.encode_action(text)]

            ids = [call(i) for i in range(len(ids))]
            lps = None if lps is None else [[float("nan")] * len(row) for row in ids]
        calls.append(len(prompt_ids))
        return ids, lps

    trainer._generate_single_turn = wrapped
    turns: list[list[int]] = []
    orig_call = rollout.__call__

    def rollout_call(prompts, tr):
        calls.clear()
        out = orig_call(prompts, tr)
        turns.append(out["env_turns"])
        # a random model earns no reward, so no advantage and no update: reward the last token id mod 5 instead
        # (varies within each group), so the weights move and a stale server shows in the logprobs
        out["env_reward"] = [float(c[-1] % 5) for c in out["completion_ids"]]
        return out

    trainer.rollout_func = rollout_call
    trainer.train()
    result = {
        "world": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "zero_stage": (trainer.accelerator.state.deepspeed_plugin.zero_stage
                       if trainer.accelerator.state.deepspeed_plugin else None),
        "log_history": trainer.state.log_history, "turns": turns, "pushes": PUSHES,
        "ref_model": trainer.ref_model is not None, "name_or_path": str(trainer.model.config._name_or_path)
        if hasattr(trainer.model, "config") else None,
    }
    Path(OUT, f"rank{rank}.json").write_text(json.dumps(result))
    rollout.close()
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
