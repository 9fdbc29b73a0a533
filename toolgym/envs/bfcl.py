"""``toolgym/BFCL-v0``: the Berkeley Function Calling Leaderboard's categories as episodes scored by BFCL's checkers.

``gym.make("toolgym/BFCL-v0", category="simple_python", split="test")``. The tools offered to the model are the
entry's functions (dots in names -> underscores, BFCL's ``dict`` -> ``object``, as BFCL's FC handlers send them),
rendered in the policy's own chat format like any toolgym tool; names are mapped back before checking.

* **Single-turn** (``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``, ``simple_java``,
  ``simple_javascript``, ``live_*``): one assistant turn; its calls are checked by BFCL's AST checker, never run.
  ``irrelevance`` / ``live_irrelevance``: the right answer is no call.
* **Multi-turn** (``multi_turn_base``, ``multi_turn_miss_func``, ``multi_turn_miss_param``,
  ``multi_turn_long_context``): each episode builds its own simulator instances from the entry's ``initial_config``
  (:class:`toolgym.tools.bfcl_api.APISession`); the calls of one action run in the order written and their results
  come back as tool messages; an assistant turn without a call ends the user turn and the env answers with the next
  user message. At the turn where BFCL reveals held-out functions (``multi_turn_miss_func``) the message is BFCL's
  (the functions' docs, then "I have updated some more functions you can choose from. What about now?"). As in
  BFCL's executor, any public method of the entry's classes runs when called (its name is checked against the
  simulator's methods; nothing is ``eval``'d). More than BFCL's step limit (20) of steps with calls in one user turn ends the episode
  (BFCL's force-quit: the entry fails).

Reward (:mod:`toolgym.rewards.bfcl`): outcome 1.0 exactly when BFCL's checker says valid; the verdict
(``valid``, ``error_type``, ``error``, ``truncated``) is ``info["bfcl"]`` on the last step and
``trajectory.task["bfcl"]``. Multi-turn also has a process reward: each user turn with a non-empty ground truth
earns ``1 / (number of such turns)`` when BFCL's state and response checks pass for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from toolgym.data.bfcl import (
    CATEGORIES,
    category_kind,
    dumps_functions,
    load_category,
    parse_categories,
    to_tool_schema,
)
from toolgym.envs.base import ToolEnv
from toolgym.rewards.base import Reward, Score
from toolgym.rewards.bfcl import ast_verdict, irrelevance_verdict, multi_turn_verdict, turn_verdict
from toolgym.tools.base import ToolErrorKind, ToolResult, error_text
from toolgym.tools.bfcl_api import APISession, CallRejected, call_string, check_call
from toolgym.trajectory import Trajectory, Turn

__all__ = ["BUDGETS", "STEP_LIMIT", "BFCLEnv"]

#: default ``max_episode_tokens`` by category kind (a multi-turn prompt with its function docs is ~4-5k tokens)
BUDGETS = {"ast": 8192, "irrelevance": 8192, "multi_turn": 16384}
#: BFCL's ``MAXIMUM_STEP_LIMIT``: steps with calls allowed in one user turn
STEP_LIMIT = 20
#: what the oracle of an irrelevance entry answers
NO_CALL_TEXT = "None of the available functions can answer this request."


def _first_value(option: Any) -> Any:
    """A value from one possible-answer option: a dict option whose values are option lists is read recursively, a
    list of such dicts is a list of them; anything else is the value itself."""
    if isinstance(option, dict) and option and all(isinstance(v, list) for v in option.values()):
        return _first_options(option, ())
    if isinstance(option, list) and option and all(isinstance(x, dict) for x in option):
        return [_first_value(x) for x in option]
    return option


def _first_options(params: Mapping[str, Any], required: Any) -> dict[str, Any]:
    """One possible value of every argument: an optional argument whose options allow "" (omit) is left out; a
    required one takes its first option other than ""; the rest their first option."""
    out = {}
    for p, opts in params.items():
        if not isinstance(opts, list) or not opts:
            continue
        values = [o for o in opts if o != ""]
        if not values or (p not in required and "" in opts):
            continue
        out[p] = _first_value(values[0])
    return out


def _literal(value: Any, type_name: str, language: str) -> Any:
    """A scalar ground-truth value as the string a Java / JavaScript function-calling answer writes (BFCL shows
    those parameters as strings): ``true``, ``5L`` (Java long), ``1.5f`` (Java float); other values unchanged."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if language == "java" and type_name == "long":
            return f"{int(value)}L"
        if language == "java" and type_name == "float":
            return f"{value}f"
        return str(value)
    return value


class _Verdict(Reward):
    """BFCL's verdict as a reward: the env computes it; this reads it (one instance per env)."""

    def __init__(self, env: BFCLEnv) -> None:
        self.env = env
        self.per_turn = "multi_turn" in env.kinds

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        v = self.env.finish_verdict(trajectory)
        return Score(1.0 if v["valid"] else 0.0, {"bfcl_valid": float(v["valid"])})

    async def turn(self, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        passed = self.env.pop_turn_pass()
        if passed is None:
            return Score(0.0, {})
        return Score(self.env.turn_share if passed else 0.0, {"bfcl_turn_pass": float(passed)})


class BFCLEnv(ToolEnv):
    """One BFCL category as an env.

    Args:
        category: a category of :data:`toolgym.data.bfcl.CATEGORIES`, or several (a comma-separated string or a
            list of names and groups of :data:`toolgym.data.bfcl.GROUPS`, e.g. ``"single_turn"``): a training
            mixture whose episodes draw from all of them (each episode is scored as its entry's category).
        split: ``"all"`` (the leaderboard's set), ``"train"`` or ``"test"`` (by a hash of the entry id).
        max_episode_tokens: token budget (default :data:`BUDGETS` of the category's kind).
        step_limit: steps with calls allowed per user turn (BFCL's 20).
        **kwargs: :class:`~toolgym.envs.base.ToolEnv` options (tokenizer, parser, ...).
    """

    def __init__(self, category: str | Sequence[str] = "simple_python", split: str = "all",
                 max_episode_tokens: int | None = None, step_limit: int = STEP_LIMIT, **kwargs: Any) -> None:
        names = [category] if isinstance(category, str) and "," not in category and category in CATEGORIES else (
            parse_categories(category))
        self.categories = list(names)
        self.kinds = {category_kind(c) for c in names}
        self.category = names[0]  # the current episode's category (set at each reset)
        self.kind = category_kind(self.category)
        self.split, self.step_limit = split, int(step_limit)
        rows = [r for c in names for r in load_category(c, split)]
        if not rows:
            raise ValueError(f"BFCL category {category!r} has no entries in split {split!r}")
        n_user_turns = max(len(r["question"]) for r in rows)
        max_turns = 1 if "multi_turn" not in self.kinds else n_user_turns * (self.step_limit + 1) + 1
        kwargs.pop("reward", None)
        kwargs.setdefault("max_obs_tokens", 1024)
        super().__init__(rows, (), reward=_Verdict(self), max_turns=kwargs.pop("max_turns", max_turns),
                         max_episode_tokens=max_episode_tokens or max(BUDGETS[k] for k in self.kinds), **kwargs)
        self._reset_episode()

    # -- episode state -----------------------------------------------------------------------------
    def _reset_episode(self) -> None:
        self.verdict: dict[str, Any] | None = None
        self.user_turn = 0
        self.steps_in_turn = 0
        self.force_quit = False
        self.decoded: list[list[list[str]]] = []  # per finished user turn, per step: the call strings
        self._steps: list[list[str]] = []  # the current user turn's steps
        self._results: list[str] = []  # every executed call's result, all turns (BFCL's response check)
        self._turn_pass: bool | None = None
        self.turn_passes: list[bool] = []
        self.session: APISession | None = None
        self.truth: APISession | None = None
        self.allowed: list[str] = []

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The current entry's functions as tool specs (none before the first reset)."""
        return list(self.task.get("tools", [])) if self.task else []

    def build_messages(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The entry's first user turn (BFCL's messages, a system message included when the entry has one)."""
        return [dict(m) for m in task["question"][0]]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        self._reset_episode()
        obs, info = super().reset(seed=seed, options=options)
        task = self.task
        if task.get("category") not in self.categories:
            raise ValueError(f"task {task.get('id')!r} is not an entry of {', '.join(self.categories)}")
        self.category, self.kind = task["category"], task["kind"]
        if self.kind == "multi_turn":
            long = "long_context" in self.category
            self.session = APISession(task["involved_classes"], task["initial_config"], long_context=long)
            self.truth = APISession(task["involved_classes"], task["initial_config"], long_context=long)
            # BFCL's executor runs any public method of the entry's classes (a held-out function too, before it is
            # revealed); so does this env: the names are checked against the simulator's methods, never eval'd
            self.allowed = sorted(self.session.methods)
        return obs, info

    @property
    def turn_share(self) -> float:
        """The process reward of one passing user turn: 1 / (turns with a non-empty ground truth)."""
        n = sum(1 for t in self.task.get("ground_truth", []) if t)
        return 1.0 / n if n else 0.0

    def pop_turn_pass(self) -> bool | None:
        """Whether the user turn that ended this step passed BFCL's checks (``None``: no checked turn ended)."""
        p, self._turn_pass = self._turn_pass, None
        return p

    # -- the environment's answer ------------------------------------------------------------------
    async def env_response(self, turn: Turn) -> list[dict[str, Any]] | None:
        if self.kind != "multi_turn":
            return None  # single-turn: the calls are checked, never run
        good = [c for c in turn.calls if c.parse_error is None]
        if not good:
            return self._end_user_turn()
        assert self.session is not None
        results, step = [], []
        for c in turn.calls:
            if c.parse_error is not None:
                results.append(ToolResult(c, error_text(ToolErrorKind.PARSE_ERROR, c.parse_error),
                                          ToolErrorKind.PARSE_ERROR))
                continue
            try:
                name, args = check_call(c.name, c.arguments, self.allowed)
            except CallRejected as e:
                kind = ToolErrorKind.UNKNOWN_TOOL if c.name not in self.allowed else ToolErrorKind.INVALID_ARGUMENTS
                results.append(ToolResult(c, error_text(kind, str(e)), kind))
                continue
            out = self.session.call(name, args)  # in the order written: the calls of one action change state
            step.append(call_string(name, args))
            self._results.append(out)
            failed = out.startswith("Error during execution")
            results.append(ToolResult(c, out, ToolErrorKind.EXCEPTION if failed else None, attempts=1))
        for r in results:
            if len(r.content) > self.max_obs_chars:
                r.content = r.content[: self.max_obs_chars] + " …[truncated]"
        turn.results = results
        if step:
            self._steps.append(step)
        self.steps_in_turn += 1
        if self.steps_in_turn > self.step_limit:
            self.force_quit = True
            return None
        return [self.format.tool_message(r.call.name or "error", r.content, r.call.id) for r in results]

    def _end_user_turn(self) -> list[dict[str, Any]] | None:
        """Close the current user turn (BFCL's per-turn checks) and answer with the next one (``None``: done)."""
        assert self.session is not None and self.truth is not None
        k = self.user_turn
        self.decoded.append(self._steps)
        truth = self.task["ground_truth"][k]
        truth_results = [self.truth.call_ground_truth(s) for s in truth]
        if truth:
            v = turn_verdict(self.session.instances, self.truth.instances, self._results, truth_results, k,
                             model_called=any(self._steps))
            self._turn_pass = v["valid"]
            self.turn_passes.append(v["valid"])
        self._steps, self.steps_in_turn = [], 0
        self.user_turn = k = k + 1
        question = self.task["question"]
        if k >= len(question):
            return None
        revealed = self.task.get("missed_function", {}).get(str(k), [])
        if revealed:
            from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

            tools = [to_tool_schema(f) for f in revealed]
            text = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=dumps_functions(tools))
            return [{"role": "user", "content": text}]
        return [dict(m) for m in question[k]]

    # -- verdict -----------------------------------------------------------------------------------
    def finish_verdict(self, trajectory: Trajectory) -> dict[str, Any]:
        """BFCL's verdict on the finished episode (also stored as ``info["bfcl"]`` and ``trajectory.task["bfcl"]``)."""
        if self.verdict is not None:
            return self.verdict
        task = self.task
        if self.kind == "multi_turn":
            v = multi_turn_verdict(task, self.decoded) if not self.force_quit else {
                "valid": False, "error_type": "multi_turn:force_terminated",
                "error": f"more than {self.step_limit} steps in turn {self.user_turn}"}
        else:
            calls = trajectory.turns[-1].calls if trajectory.turns else []
            good = [c for c in calls if c.parse_error is None]
            if self.kind == "irrelevance":
                v = irrelevance_verdict(len(good))
            else:
                names = task["name_map"]
                v = ast_verdict(task, [(names.get(c.name, c.name), c.arguments) for c in good],
                                parse_failed=len(good) < len(calls))
        cut = trajectory.truncated or len(trajectory.prompt_ids) >= self.max_episode_tokens or any(
            t.cut for t in trajectory.turns)
        v = {**v, "truncated": bool(cut), "category": self.category, "id": task.get("id")}
        if self.kind == "multi_turn":
            v["turn_passes"] = list(self.turn_passes)
        self.verdict = v
        trajectory.task["bfcl"] = v
        return v

    async def astep(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = await super().astep(action)
        if (terminated or truncated) and self.verdict is not None:
            info["bfcl"] = dict(self.verdict)
        return obs, reward, terminated, truncated, info

    # -- oracle ------------------------------------------------------------------------------------
    def oracle(self, state: Any) -> str:
        """BFCL's ground truth as this env's answer: single-turn, the first possible value of every argument
        (optional ones left out when "" is allowed first); irrelevance, a reply without a call; multi-turn, every
        ground-truth call of the user turn in one action, then a reply without a call."""
        task, fmt = state.task, self.format.parser
        if self.kind == "irrelevance":
            return NO_CALL_TEXT
        if self.kind == "ast":
            back = {v: k for k, v in task["name_map"].items()}
            calls = []
            docs = {f["name"]: f for f in task["functions"]}
            lang = {"simple_java": "java", "simple_javascript": "javascript"}.get(self.category)
            for item in task["ground_truth"]:
                (name, params), = item.items()
                schema = docs.get(name, {}).get("parameters", {})
                args = _first_options(params, schema.get("required", []))
                if lang:
                    props = schema.get("properties", {})
                    args = {k: _literal(v, props.get(k, {}).get("type", ""), lang) for k, v in args.items()}
                calls.append((back.get(name, name), args))
            return fmt.format_calls(calls)
        truth = task["ground_truth"][self.user_turn] if self.user_turn < len(task["ground_truth"]) else []
        if self.steps_in_turn == 0 and truth:
            assert self.session is not None
            return fmt.format_calls([self.session.keyword_form(s) for s in truth])
        return "Done."
