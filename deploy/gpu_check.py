"""The GPU check: toolgym's GPU path end to end on any CUDA machine, one JSON report and one table.

Stages, each a subprocess under its own time limit (a stage that fails or times out is reported, the next runs):

1. ``env``: torch, CUDA, the GPU, transformers / TRL / accelerate versions.
2. ``demo``: ``python -m trainers.demo`` with ``trainers/configs/demo_cpu.yaml`` on the device (``device:`` set;
   ``optim: adamw_torch`` where bitsandbytes is missing; ``threads`` = the CPUs this process may use): held-out
   success before training, after the warm start and after GRPO, and GRPO's own paired gain.
3. ``chain``: a few GRPO steps of the turn-level trainer (``--advantage turn_return``) on CalculatorChain-v0
   (``toolgym train grpo --config grpo_chain_turn_cpu``) on the device.
4. ``generation``: ``python -m benchmarks.generate_vs_bare`` at N = 64 / 256 / 512 episodes: toolgym's generation against
   bare ``model.generate`` on the same prompts, same tokens checked, as ratios.
5. ``vision``: ``python -m deploy.vision_check``: a tiny random Qwen2.5-VL with an image in the task and in a tool
   result, generated on the device and checked against a plain processor forward, then through vLLM (one
   placeholder per image) when vLLM is installed.

Run (from a checkout; on a node without network, first install the bundle of ``deploy/gpu_bundle.py``)::

    python -m deploy.gpu_check --out runs/gpu-check            # on a CUDA machine
    python -m deploy.gpu_check --device cpu --smoke --out DIR   # every stage at toy size, on a CPU (tests)

Without a GPU and without ``--device cpu`` it exits 3 and says so. Writes ``OUT/gpu_check.json`` and
``OUT/gpu_check.md``; exit status 0 when every stage passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "run_stage"]

ROOT = Path(__file__).resolve().parent.parent


def cpu_budget() -> int:
    """CPUs this process may use (its affinity; a container's quota can be lower than the host's core count)."""
    return max(1, len(os.sched_getaffinity(0)))


def run_stage(name: str, cmd: list[str], timeout_s: float, out: Path, env: dict[str, str] | None = None
              ) -> dict[str, Any]:
    """Run one stage's command; its stdout and stderr go to ``out/NAME.log``. Returns ``{"stage", "cmd", "ok",
    "exit", "wall_s", "log"}`` (``exit`` is ``"timeout"`` when it ran past ``timeout_s`` seconds)."""
    log = out / f"{name}.log"
    t0 = time.perf_counter()
    with log.open("w") as fh:
        try:
            rc: int | str = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=ROOT,
                                           env={**os.environ, **(env or {})}).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"stage": name, "cmd": " ".join(cmd), "ok": rc == 0, "exit": rc,
            "wall_s": round(time.perf_counter() - t0, 1), "log": str(log)}


def _env_info(device: str) -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
                            "device": device, "cpus": cpu_budget()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["bf16"] = bool(torch.cuda.is_bf16_supported())
    for pkg in ("transformers", "trl", "accelerate", "peft", "vllm", "bitsandbytes"):
        try:
            info[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            info[pkg] = None
    return info


def _demo_config(out: Path, device: str, smoke: bool, has_bnb: bool) -> Path:
    import yaml

    cfg = yaml.safe_load((ROOT / "trainers" / "configs" / "demo_cpu.yaml").read_text())
    cfg.update({"device": device, "threads": cpu_budget(), "output_dir": str(out / "demo")})
    if not has_bnb:
        cfg["optim"] = "adamw_torch"
    if smoke:
        cfg.update({"eval_tasks": 4, "warmstart_episodes": 8, "warmstart_steps": 1, "grpo_steps": 1,
                    "grpo_tasks": 4, "grpo_prompts_per_step": 1, "grpo_num_generations": 2})
    path = out / "demo_config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _demo_figures(out: Path) -> dict[str, Any]:
    path = out / "demo" / "metrics.json"
    if not path.is_file():
        return {}
    m = json.loads(path.read_text())
    figs: dict[str, Any] = {k: (m.get(k) or {}).get("success")
                            for k in ("eval_before", "eval_after_warmstart", "eval_after_grpo")}
    figs["grpo_gain"] = m.get("grpo_gain")
    figs["grpo_wall_s"] = (m.get("grpo") or {}).get("wall_s")
    figs["total_wall_s"] = m.get("total_wall_s")
    return figs


def _table(report: dict[str, Any]) -> str:
    lines = [f"GPU check on {report['env'].get('gpu', 'no GPU')} ({report['env']['device']}), torch "
             f"{report['env']['torch']}, transformers {report['env'].get('transformers')}, TRL "
             f"{report['env'].get('trl')}, vLLM {report['env'].get('vllm') or 'not installed'}", "",
             "| stage | ok | wall s | figures |", "|---|---|---:|---|"]
    for s in report["stages"]:
        figs = json.dumps(s.get("figures", {}), default=str)
        lines.append(f"| {s['stage']} | {'yes' if s['ok'] else 'NO (' + str(s['exit']) + ')'} | {s['wall_s']} | "
                     f"{figs[:300]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/gpu-check", help="where the report, the logs and the runs go")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (with --smoke: a CPU test of the check)")
    ap.add_argument("--smoke", action="store_true", help="every stage at toy size (minutes on a CPU)")
    ap.add_argument("--stages", default="demo,chain,generation,vision", help="comma-separated stages to run")
    ap.add_argument("--sizes", default="64,256,512", help="episodes per generation comparison")
    ap.add_argument("--chain-steps", type=int, default=4, help="GRPO steps of the turn-level trainer")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per stage")
    a = ap.parse_args(argv)

    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device here (torch.cuda.is_available() is False); run it on a GPU "
              "machine, or pass --device cpu --smoke to check the stages on a CPU", file=sys.stderr)
        return 3
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env_info = _env_info(a.device)
    report: dict[str, Any] = {"env": env_info, "stages": [], "smoke": a.smoke,
                              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    py = sys.executable
    stages = [s.strip() for s in a.stages.split(",") if s.strip()]
    child_env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if "demo" in stages:
        cfg = _demo_config(out, a.device, a.smoke, env_info.get("bitsandbytes") is not None)
        st = run_stage("demo", [py, "-m", "trainers.demo", "--config", str(cfg)], a.timeout, out, child_env)
        st["figures"] = _demo_figures(out)
        report["stages"].append(st)
    if "chain" in stages:
        steps = 1 if a.smoke else a.chain_steps
        cmd = [py, "-m", "toolgym.cli", "train", "grpo", "--config", "grpo_chain_turn_cpu", "--max_steps", str(steps),
               "--output_dir", str(out / "chain"), "--use_cpu", "true" if a.device == "cpu" else "false",
               "--toolgym.threads", str(cpu_budget())]
        if a.smoke:
            cmd += ["--toolgym.model", "tiny", "--per_device_train_batch_size", "2", "--num_generations", "2",
                    "--max_completion_length", "32", "--toolgym.max_turn_tokens", "8", "--toolgym.num_train_tasks", "4"]
        report["stages"].append(run_stage("chain", cmd, a.timeout, out, child_env))
    if "generation" in stages:
        sizes = [2] if a.smoke else [int(n) for n in a.sizes.split(",") if n.strip()]
        for n in sizes:
            js = out / f"generation_{n}.json"
            cmd = [py, "-m", "benchmarks.generate_vs_bare", "--device", a.device, "--episodes", str(n),
                   "--new-tokens", "4" if a.smoke else "64", "--repeats", "1" if a.smoke else "3", "--json", str(js)]
            st = run_stage(f"generation_{n}", cmd, a.timeout, out, child_env)
            st["figures"] = json.loads(js.read_text()) if js.is_file() else {}
            report["stages"].append(st)
    if "vision" in stages:
        js = out / "vision.json"
        st = run_stage("vision", [py, "-m", "deploy.vision_check", "--device", a.device, "--json", str(js)], a.timeout,
                       out, child_env)
        st["figures"] = json.loads(js.read_text()) if js.is_file() else {}
        report["stages"].append(st)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    table = _table(report)
    (out / "gpu_check.md").write_text(table)
    print(table)
    print(f"gpu_check: wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
    return 0 if all(s["ok"] for s in report["stages"]) else 1


if __name__ == "__main__":
    sys.exit(main())
