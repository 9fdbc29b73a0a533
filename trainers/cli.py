"""``toolgym train {grpo,rft,sft,dpo} --config FILE.yaml [--field value ...]``: one entry point for the trainers.

The YAML file has a ``toolgym:`` section (:class:`~trainers.grpo.ToolgymGRPOArgs` for ``grpo``,
:class:`ToolgymSFTArgs` for ``sft``) and everything else is a field of the TRL config (``trl.GRPOConfig`` /
``trl.SFTConfig``). Any field can be overridden on the command line, TRL-style::

    toolgym train grpo --config trainers/configs/grpo_calculator_cpu.yaml \\
        --max_steps 2 --learning_rate 1e-5 --toolgym.env_id toolgym/SQL-v0 --report_to tensorboard
    accelerate launch --cpu --num_processes 1 -m trainers.cli grpo --config FILE.yaml   # same, under accelerate

* ``--key value``, ``--key=value``, or ``--flag`` alone (= ``true``); dashes in names are read as underscores
  (``--max-steps`` = ``--max_steps``); a dotted key sets a nested field (``--toolgym.env_kwargs.split test``).
* Values are YAML scalars or flow collections (``2``, ``1.0e-5``, ``true``, ``null``, ``[tensorboard, mlflow]``,
  ``{split: test}``), then converted to the field's type where it is a plain ``int``/``float``/``bool`` (so
  ``1e-5``, a string in YAML 1.1, is the float it looks like).
* ``--dry-run`` prints the resolved configuration as one JSON object and exits without loading a model.
* ``toolgym.model: tiny`` trains a tiny random model (:func:`toolgym.models.tiny_random_model`): for smoke tests.

Errors are one line on stderr with an exit code: ``2`` for an unknown or misspelt key (naming the close matches),
a value of the wrong type or a config TRL rejects; ``3`` for a config file that cannot be read or a missing
``[train]`` extra (TRL/torch not installed); ``1`` for a failure during training (``TOOLGYM_DEBUG=1`` re-raises it
with its traceback); ``130`` when interrupted.

``rft`` runs ``RFT_MODULE`` (``trainers.rft``): it must define ``RFTConfig``, a dataclass whose fields are the
valid keys (a nested ``toolgym`` section is checked against ``RFTConfig.toolgym``'s dataclass type when it has
one), and either ``run_rft(cfg: RFTConfig)`` (called with the resolved config) or ``main(argv)`` accepting
``--config FILE`` (called with the resolved config written to a temporary YAML file).
"""

from __future__ import annotations

import builtins
import dataclasses
import difflib
import importlib
import json
import os
import sys
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

__all__ = ["ALGORITHMS", "RFT_MODULE", "ConfigError", "ToolgymSFTArgs", "main", "parse_overrides", "resolve"]

ALGORITHMS = ("grpo", "rft", "sft", "dpo")
#: the module ``toolgym train rft`` runs (helper contract in the module doc)
RFT_MODULE = "trainers.rft"
#: algorithms run by a module of their own: name -> (module, config dataclass, runner taking the config)
MODULE_ALGORITHMS: dict[str, tuple[str, str, str]] = {
    "rft": (RFT_MODULE, "RFTConfig", "run_rft"),
    "dpo": ("trainers.dpo", "DPORunConfig", "run_dpo"),
}
#: top-level modules whose absence means the ``[train]`` extra is not installed
_TRAIN_DEPS = {"trl", "torch", "accelerate", "datasets", "peft", "transformers"}


class ConfigError(Exception):
    """A configuration problem reported as one line; ``code`` is the exit code (2 usage, 3 file/install)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.message, self.code = message, code


@dataclass
class ToolgymSFTArgs:
    """The ``toolgym:`` section of an SFT config (``toolgym train sft``): roll out a policy (by default the env's
    oracle), keep the episodes whose reward clears ``threshold``, and fine-tune on them with the env's loss mask.

    Attributes:
        model: model path / hub id; ``None`` = the embedded SmolLM2-135M-Instruct; ``"tiny"`` = a tiny random model.
        dtype: weights dtype (``float32``, ``bfloat16``).
        env_id: toolgym env id.
        env_kwargs: forwarded to the env (e.g. ``{"split": "train"}``).
        policy: who collects the episodes: ``"oracle"`` (the env's ``oracle``) or ``"model"`` (the model itself).
        episodes: episodes to roll out (tasks drawn with seeds ``task_seed ...``).
        task_seed: first task seed.
        threshold: keep episodes with reward >= this.
        max_turn_tokens: tokens sampled per assistant turn.
        num_envs: episodes run at once.
        temperature: sampling temperature of ``policy: model``.
        trajectory_path: JSONL to write the kept episodes to (``None``: ``<output_dir>/sft_trajectories.jsonl``).
        threads: torch CPU threads (``0``: leave torch's default).
    """

    model: str | None = None
    dtype: str = "float32"
    env_id: str = "toolgym/Calculator-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    policy: str = "oracle"
    episodes: int = 64
    task_seed: int = 0
    threshold: float = 1.0
    max_turn_tokens: int = 128
    num_envs: int = 16
    temperature: float = 1.0
    trajectory_path: str | None = None
    threads: int = 0


# ---------------------------------------------------------------------------------------------------------------
# Command-line overrides
# ---------------------------------------------------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """A command-line value as YAML (``2`` -> int, ``true`` -> bool, ``[a, b]`` -> list); unparsable text stays a
    string."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_overrides(tokens: Sequence[str]) -> dict[str, Any]:
    """``["--a.b", "1", "--c=x", "--flag"]`` -> ``{"a.b": 1, "c": "x", "flag": True}`` (dashes in names become
    underscores; a name not followed by a value is ``True``).

    Raises:
        ConfigError: a token that is not an option (``value`` without ``--name``), or an empty name.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or tok == "--":
            raise ConfigError(f"unexpected argument {tok!r}: overrides are --name value (or --name=value)")
        name, eq, value = tok[2:].partition("=")
        if not name:
            raise ConfigError(f"empty option name in {tok!r}")
        name = ".".join(part.replace("-", "_") for part in name.split("."))
        if eq:
            out[name] = parse_value(value)
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[name] = parse_value(tokens[i + 1])
            i += 2
        else:
            out[name] = True
            i += 1
    return out


def _set_dotted(cfg: dict[str, Any], key: str, value: Any) -> None:
    """``cfg["a"]["b"] = value`` for ``key="a.b"`` (sections created as needed)."""
    parts = key.split(".")
    node = cfg
    for k, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"--{key}: {'.'.join(parts[:k + 1])} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _hints(cls: type) -> dict[str, Any]:
    """Field name -> type of the dataclass ``cls`` (string annotations resolved one by one; ``object`` for
    what cannot be resolved, i.e. not checked)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - some annotation does not resolve: resolve the others
        pass
    module = sys.modules.get(cls.__module__)
    namespace = {**vars(builtins), **(vars(module) if module is not None else {})}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        tp = f.type
        if isinstance(tp, str):
            try:
                tp = eval(tp, namespace)  # what typing.get_type_hints does for each annotation
            except Exception:  # noqa: BLE001
                tp = object
        out[f.name] = tp
    return out


def _scalar_types(tp: Any) -> set[type]:
    """The plain scalar types (``int``, ``float``, ``bool``, ``str``) a type hint admits; empty = anything else."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_scalar_types(a) for a in typing.get_args(tp)))
    if tp in (int, float, bool, str, type(None)):
        return {tp}
    if origin is typing.Literal:
        return {type(a) for a in typing.get_args(tp)}
    return {object}  # containers, enums, classes: leave the value alone


def _coerce(key: str, value: Any, tp: Any, where: str) -> Any:
    """``value`` converted to the scalar type ``tp`` admits (``"1e-5"`` -> 1e-05 for a float field)."""
    allowed = _scalar_types(tp)
    if object in allowed or value is None or type(value) in allowed:
        return value
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return value  # an int is a fine float
    if float in allowed and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if int in allowed and isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    if str in allowed and isinstance(value, int | float | bool):
        return str(value)
    names = "/".join(sorted(t.__name__ for t in allowed if t is not type(None)))
    raise ConfigError(f"{where}{key}: expected {names}, got {value!r}")


def _check(section: Mapping[str, Any], cls: type, prefix: str, where: str) -> dict[str, Any]:
    """Check the keys of ``section`` against the dataclass ``cls``, converting scalar values to the field types.

    Raises:
        ConfigError: an unknown key (the message names up to 3 close matches) or a value of the wrong type.
    """
    hints = _hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    noun = "option" if prefix.startswith("--") else "key"
    out: dict[str, Any] = {}
    for key, value in section.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
            hint = (f"; did you mean {' or '.join(prefix + c for c in close)}?" if close
                    else f" (not a field of {cls.__module__}.{cls.__qualname__})")
            raise ConfigError(f"{where}unknown {noun} {prefix}{key}{hint}")
        out[key] = _coerce(prefix + key, value, hints[key], where) if key in hints else value
    return out


# ---------------------------------------------------------------------------------------------------------------
# Resolving a config
# ---------------------------------------------------------------------------------------------------------------


def _import_train(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in _TRAIN_DEPS:
            raise ConfigError(
                f"`toolgym train` needs the [train] extra (missing module {e.name!r}): "
                "pip install torch==2.13.0 && pip install 'toolgym[train]'", code=3
            ) from None
        raise


def _classes(algo: str) -> tuple[type, type | None]:
    """``(TRL-or-RFT config class, toolgym section class or None)`` for ``algo``."""
    if algo == "grpo":
        trl = _import_train("trl")
        from trainers.grpo import ToolgymGRPOArgs

        return trl.GRPOConfig, ToolgymGRPOArgs
    if algo == "sft":
        trl = _import_train("trl")
        return trl.SFTConfig, ToolgymSFTArgs
    if algo in MODULE_ALGORITHMS:
        module, cfg_name, _ = MODULE_ALGORITHMS[algo]
        try:
            mod = _import_train(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            raise ConfigError(f"`toolgym train {algo}` needs {module} (not in this install)", code=3) from None
        cfg = getattr(mod, cfg_name, None)
        if cfg is None or not dataclasses.is_dataclass(cfg):
            raise ConfigError(f"{module} defines no {cfg_name} dataclass", code=3)
        hints = _hints(cfg)
        tg = hints.get("toolgym")
        return cfg, tg if isinstance(tg, type) and dataclasses.is_dataclass(tg) else None
    raise ConfigError(f"unknown algorithm {algo!r}; choose one of {', '.join(ALGORITHMS)}")


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The YAML mapping in ``path``. Raises :class:`ConfigError` (code 3) when it cannot be read or is not one."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh) or {}
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or e}", code=3) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path} is not valid YAML: {' '.join(str(e).split())}", code=3) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a YAML mapping, got {type(raw).__name__}", code=3)
    return raw


def resolve(algo: str, config: str | os.PathLike[str] | Mapping[str, Any] | None,
            overrides: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Merge ``config`` (a YAML path or a mapping) with dotted ``overrides``; check every key and scalar type.

    Returns ``(trainer_fields, toolgym_fields)``: plain dicts ready for ``GRPOConfig(**...)`` /
    ``ToolgymGRPOArgs(**...)`` (for ``rft``: the whole ``RFTConfig`` mapping, ``toolgym`` section included, and
    ``{}``).

    Raises:
        ConfigError: an unknown key (with the close matches), a wrong scalar type, an unreadable file.
    """
    cfg_cls, tg_cls = _classes(algo)
    raw = dict(read_config(config) if isinstance(config, str | os.PathLike) else (config or {}))
    where = f"{config}: " if isinstance(config, str | os.PathLike) else ""
    section = algo not in MODULE_ALGORITHMS or "toolgym" in {f.name for f in dataclasses.fields(cfg_cls)}
    raw_tg = raw.pop("toolgym", None) if section else None
    if not isinstance(raw_tg or {}, dict):
        raise ConfigError(f"{where}the toolgym section must be a mapping")
    # the file first (errors name the file), then the file + the overrides (errors name the option)
    args = _check(raw, cfg_cls, "", where)
    tg = _check(raw_tg or {}, tg_cls, "toolgym.", where) if tg_cls is not None else dict(raw_tg or {})
    merged: dict[str, Any] = {**args, "toolgym": tg} if section else dict(args)
    for key, value in (overrides or {}).items():
        _set_dotted(merged, key, value)
    over_tg = merged.pop("toolgym", {}) if section else {}
    args = _check(merged, cfg_cls, "--", "")
    tg = _check(over_tg, tg_cls, "--toolgym.", "") if tg_cls is not None else over_tg
    if algo in MODULE_ALGORITHMS:
        return ({**args, "toolgym": tg} if section else args), {}
    return args, tg


# ---------------------------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------------------------


def _model(tg: Any, seed: int) -> tuple[Any, Any]:
    import torch

    from toolgym.models import load_model, load_tokenizer, tiny_random_model

    if tg.threads:
        torch.set_num_threads(tg.threads)
    if tg.model == "tiny":
        tok = load_tokenizer(None)
        return tiny_random_model(tok, seed=seed), tok
    return load_model(tg.model, dtype=getattr(torch, tg.dtype))


def _trl_config(cls: type, fields_: dict[str, Any]) -> Any:
    try:
        return cls(**fields_)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"invalid {cls.__name__}: {' '.join(str(e).split())}") from None


def _grpo_section(tg_fields: dict[str, Any]) -> Any:
    """``ToolgymGRPOArgs(**tg_fields)``; its value checks (``advantage``, ``gamma``) become :class:`ConfigError`."""
    from trainers.grpo import ToolgymGRPOArgs

    try:
        return ToolgymGRPOArgs(**tg_fields)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def run_grpo(args_fields: dict[str, Any], tg_fields: dict[str, Any]) -> int:
    """GRPO through :func:`trainers.grpo.build_trainer`; saves the model to ``output_dir``."""
    from trl import GRPOConfig

    from trainers.grpo import ToolgymGRPOArgs, build_trainer

    args = _trl_config(GRPOConfig, args_fields)
    tg = ToolgymGRPOArgs(**tg_fields)
    model, tok = _model(tg, args.seed)
    trainer, rollout = build_trainer(tg, args, model=model, tokenizer=tok)
    trainer.train()
    trainer.save_model(args.output_dir)
    rollout.close()
    if trainer.accelerator.is_main_process:
        tok.save_pretrained(args.output_dir)
        print(f"toolgym train grpo: {trainer.state.global_step} steps, model saved to {args.output_dir}")
    trainer.accelerator.end_training()  # trackers, and the process group: a rank must not exit with gloo running
    return 0


def run_sft(args_fields: dict[str, Any], tg_fields: dict[str, Any]) -> int:
    """Collect episodes (oracle or model), keep those above the threshold, fine-tune with the loss mask."""
    from trl import SFTConfig, SFTTrainer

    from toolgym.rollout import Policy, TransformersPolicy, summarize, write_trajectories
    from trainers.sft import collect, oracle_policy, sft_dataset

    args_fields = {"max_length": None, **args_fields}
    args = _trl_config(SFTConfig, args_fields)
    tg = ToolgymSFTArgs(**tg_fields)
    if tg.policy not in ("oracle", "model"):
        raise ConfigError(f"toolgym.policy must be 'oracle' or 'model', got {tg.policy!r}")
    model, tok = _model(tg, args.seed)
    policy: Policy = (oracle_policy(tg.env_id) if tg.policy == "oracle"
                      else TransformersPolicy(model, tok, temperature=tg.temperature, seed=args.seed))
    env_kwargs = {"tokenizer": tok, **tg.env_kwargs}
    kept, alltr = collect(tg.env_id, policy, [None] * tg.episodes, threshold=tg.threshold, seeds=tg.task_seed,
                          max_turn_tokens=tg.max_turn_tokens, num_envs=tg.num_envs, env_kwargs=env_kwargs)
    print(f"toolgym train sft: {len(alltr)} episodes, kept {len(kept)} (reward >= {tg.threshold}): "
          f"{summarize(alltr)}")
    if not kept:
        raise ConfigError("no episode cleared the threshold: nothing to train on", code=1)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_trajectories(tg.trajectory_path or out / "sft_trajectories.jsonl", kept)
    trainer = SFTTrainer(model=model, processing_class=tok, args=args, train_dataset=sft_dataset(kept))
    trainer.train()
    trainer.save_model(str(out))
    tok.save_pretrained(str(out))
    print(f"toolgym train sft: {trainer.state.global_step} steps, model saved to {out}")
    return 0


def run_module(algo: str, config: dict[str, Any]) -> int:
    """Run the module of ``algo`` (:data:`MODULE_ALGORITHMS`: ``rft``, ``dpo``) on the resolved config:
    ``runner(Config(**config))`` when the module has the runner, else its ``main(["--config", FILE])`` with the
    config written to a temporary YAML file."""
    import yaml

    module, cfg_name, runner_name = MODULE_ALGORITHMS[algo]
    mod = _import_train(module)
    cfg_cls = getattr(mod, cfg_name)
    runner = getattr(mod, runner_name, None)
    if callable(runner):
        hints = _hints(cfg_cls)
        kwargs = {k: (hints[k](**v) if isinstance(v, dict) and dataclasses.is_dataclass(hints.get(k)) else v)
                  for k, v in config.items()}
        runner(_trl_config(cfg_cls, kwargs))
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix=f"toolgym-{algo}-", delete=False) as fh:
        yaml.safe_dump(config, fh, sort_keys=False)
    try:
        rc = mod.main(["--config", fh.name])
    finally:
        os.unlink(fh.name)
    return rc if isinstance(rc, int) else 0


_USAGE = """usage: toolgym train {grpo,rft,sft,dpo} --config FILE.yaml [--dry-run] [--FIELD VALUE ...]

  grpo  GRPO through TRL's rollout_func (fields: trl.GRPOConfig + toolgym: trainers.grpo.ToolgymGRPOArgs)
  sft   oracle (or model) episodes -> masked SFT (fields: trl.SFTConfig + toolgym: trainers.cli.ToolgymSFTArgs)
  rft   rejection-sampling fine-tuning from the model itself (fields: trainers.rft.RFTConfig)
  dpo   DPO on env preference pairs, env tokens masked (fields: trainers.dpo.DPORunConfig)

grpo credit assignment (toolgym section; also as --advantage / --gamma):
  --advantage {outcome,turn_return,gigpo}  outcome: one advantage per episode (TRL's GRPO, the default);
        turn_return: each turn's policy tokens get its discounted reward-to-go minus a per-turn-index group
        baseline; gigpo: episode advantage + step advantage among turns starting from the same env state
  --gamma G   per-turn discount of turn_return/gigpo returns, in (0, 1] (default 1.0)

--FIELD VALUE overrides any field of the config file, e.g. --max_steps 2 --learning_rate 1e-5
--toolgym.env_id toolgym/SQL-v0 --report_to tensorboard. --dry-run prints the resolved config as JSON.
exit codes: 0 ok, 1 training failed, 2 bad key or value, 3 config file unreadable or [train] extra missing."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolgym train`` (``argv`` without the leading ``train``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    algo, rest = argv[0], argv[1:]
    try:
        if algo not in ALGORITHMS:
            close = difflib.get_close_matches(algo, ALGORITHMS, n=1)
            raise ConfigError(f"unknown algorithm {algo!r}" + (f"; did you mean {close[0]}?" if close else "")
                              + f" (choose one of {', '.join(ALGORITHMS)})")
        if any(t in ("-h", "--help") for t in rest):
            print(_USAGE)
            return 0
        dry = "--dry-run" in rest or "--dry_run" in rest
        rest = [t for t in rest if t not in ("--dry-run", "--dry_run")]
        over = parse_overrides(rest)
        if algo == "grpo":  # credit-assignment fields live in the toolgym section; accept them bare too
            for key in ("advantage", "gamma"):
                if key in over:
                    over[f"toolgym.{key}"] = over.pop(key)
        config = over.pop("config", None)
        if config is None or config is True:
            raise ConfigError("--config FILE.yaml is required")
        args, tg = resolve(algo, str(config), over)
        if algo == "grpo":
            _grpo_section(tg)  # a bad --advantage / --gamma value is a usage error (exit 2)
        if dry:
            cfg_cls, tg_cls = _classes(algo)
            _trl_config(cfg_cls, {"max_length": None, **args} if algo == "sft" else args)  # TRL's own checks
            full_tg = dataclasses.asdict(tg_cls(**tg)) if tg_cls is not None and algo not in MODULE_ALGORITHMS else tg
            print(json.dumps({"algorithm": algo, "config": args, "toolgym": full_tg}, default=str, sort_keys=True))
            return 0
        if algo == "grpo":
            return run_grpo(args, tg)
        if algo == "sft":
            return run_sft(args, tg)
        return run_module(algo, args)
    except ConfigError as e:
        print(f"toolgym train {algo}: error: {e.message}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(f"toolgym train {algo}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - one line for the user; TOOLGYM_DEBUG=1 for the traceback
        if os.environ.get("TOOLGYM_DEBUG", "") not in ("", "0"):
            raise
        print(f"toolgym train {algo}: error: {type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
