"""``toolgym/BFCL-v0``: the Berkeley Function Calling Leaderboard's categories as episodes scored by BFCL's checkers.

``gym.make("toolgym/BFCL-v0", category="simple_python", split="test")``. The tools offered to the model are the
entry's functions (dots in names -> underscores, BFCL's ``dict`` -> ``object``, as BFCL's FC handlers send them),
rendered in the policy's own chat format like any toolgym tool; names are mapped back before checking.

* **Single-turn** (``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``, ``simple_java``,
  ``simple_javascript``, ``live_*``): one assistant turn; its calls are checked by BFCL's AST checker, never run.
  ``irrelevance`` / ``live_irrelevance``: the right answer is no call.
* **Multi-turn** (``multi_turn_base``, ``multi_turn_miss_func``, ``multi_turn_miss_param``,
  ``multi_turn_long_context``): each episode builds its own simulator instances from the entry's ``initial_config``
  (:class:`toolgym.envs.bfcl.simulators.APISession`), in the env's worker process
  (:mod:`toolgym.envs.bfcl.worker`, owned by the env: ``close()`` stops it); their methods are tools
  (:class:`~toolgym.envs.bfcl.worker.SimulatorMethod`) that the env's executor runs like any tool, the calls of one
  action in the order written, under its timeout (``executor_kwargs={"default_timeout_s": ...}``), metrics, error
  kinds and result bounds; their results come back as tool messages. An assistant turn without a call ends the user
  turn and the env answers with the next user message. At the turn where
  BFCL reveals held-out functions (``multi_turn_miss_func``) the message is BFCL's
  (the functions' docs, then "I have updated some more functions you can choose from. What about now?"). As in
  BFCL's executor, any public method of the entry's classes runs when called (its name is checked against the
  simulator's methods; nothing is ``eval``'d). More than BFCL's step limit (20) of steps with calls in one user turn
  ends the episode (BFCL's force-quit: the entry fails).

Reward (:class:`toolgym.envs.bfcl.verdict.BFCLReward`): outcome 1.0 exactly when BFCL's checker says valid
(``partial_credit=True`` adds small terms for single-turn answers: docs/bfcl.md); the verdict (``valid``,
``error_type``, ``error``, ``truncated``, ...) is ``trajectory.task["bfcl"]`` (``info["trajectory"]`` on the last
step). Multi-turn also has a process reward: each user turn with a non-empty ground truth earns
``1 / (number of such turns)`` when BFCL's state and response checks pass for it; the env hands each check to the
reward on the turn that closed the user turn (``Turn.env_checks["bfcl"]``, a
:class:`~toolgym.envs.bfcl.verdict.TurnCheck`). A ``reward=`` given to the env replaces it (e.g.
``Combine({BFCLReward(): 1.0, my_reward: 0.1})``; the caller closes a reward it made); the verdict is there when
that reward computes BFCL's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from toolgym.envs.base import ToolEnv
from toolgym.envs.bfcl.data import (
    CATEGORIES,
    category_kind,
    dumps_functions,
    load_category,
    parse_categories,
    to_tool_schema,
)
from toolgym.envs.bfcl.verdict import CHECK_KEY, BFCLReward, TurnCheck, ran_calls
from toolgym.envs.bfcl.worker import SimulatorSession, SimulatorWorker
from toolgym.trajectory import Turn

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


class BFCLEnv(ToolEnv):
    """One BFCL category as an env.

    Args:
        category: a category of :data:`toolgym.envs.bfcl.data.CATEGORIES`, or several (a comma-separated string or
            a list of names and groups of :data:`toolgym.envs.bfcl.data.GROUPS`, e.g. ``"single_turn"``): a training
            mixture whose episodes draw from all of them (each episode is scored as its entry's category).
        split: ``"all"`` (the leaderboard's set), ``"train"`` or ``"test"`` (by a hash of the entry id).
        max_episode_tokens: token budget (default :data:`BUDGETS` of the category's kind).
        step_limit: steps with calls allowed per user turn (BFCL's 20).
        reward: the episode's reward (default :class:`~toolgym.envs.bfcl.verdict.BFCLReward`, BFCL's verdict,
            using the env's worker process for its multi-turn verdicts).
        partial_credit: the default reward's partial credit for single-turn answers (``False``: BFCL's binary
            verdict; ``True`` or ``{"parse": w, "names": w, "keys": w}``: :func:`~toolgym.envs.bfcl.verdict.partial_weights`).
        **kwargs: :class:`~toolgym.envs.base.ToolEnv` options (tokenizer, parser, ...).

    Attributes:
        worker: the env's simulator process (:class:`~toolgym.envs.bfcl.worker.SimulatorWorker`), started by the first
            multi-turn call, stopped by :meth:`close`.
        session: the current multi-turn episode's simulators (``None`` otherwise).
        user_turn, steps_in_turn: where the multi-turn episode is (0-based user turn; steps with calls in it).
    """

    def __init__(self, category: str | Sequence[str] = "simple_python", split: str = "all",
                 max_episode_tokens: int | None = None, step_limit: int = STEP_LIMIT, reward: Any = None,
                 partial_credit: bool | Mapping[str, float] = False, **kwargs: Any) -> None:
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
        self.worker = SimulatorWorker()
        if reward is None:
            reward = BFCLReward(self.step_limit, per_turn="multi_turn" in self.kinds, partial_credit=partial_credit,
                                checker=self.worker)
        elif partial_credit:
            raise ValueError("partial_credit configures the env's default reward; a reward given as reward= brings "
                             "its own (BFCLReward(partial_credit=...))")
        kwargs.setdefault("max_obs_tokens", 1024)
        super().__init__(rows, (), reward=reward, max_turns=kwargs.pop("max_turns", max_turns),
                         max_episode_tokens=max_episode_tokens or max(BUDGETS[k] for k in self.kinds), **kwargs)
        self._reset_episode()

    # -- episode state -----------------------------------------------------------------------------
    def _reset_episode(self) -> None:
        self.user_turn = 0
        self.steps_in_turn = 0
        self._steps: list[list[str]] = []  # the current user turn's steps: the call strings that ran
        self.session: SimulatorSession | None = None

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
            # built in the worker process on the first call; BFCL's executor runs any public method of the entry's
            # classes (a held-out function too, before it is revealed); so does this env: the names are checked
            # against the simulators' methods, never eval'd
            self.session = SimulatorSession(self.worker, task["involved_classes"], task["initial_config"],
                                            long_context="long_context" in self.category)
        return obs, info

    # -- the environment's answer ------------------------------------------------------------------
    async def env_response(self, turn: Turn) -> list[dict[str, Any]] | None:
        if self.kind != "multi_turn":
            return None  # single-turn: the calls are checked, never run
        if not any(c.parse_error is None for c in turn.calls):
            return await self._end_user_turn(turn)
        session = self.session
        assert session is not None
        tools = await session.tools(self.executor.default_timeout_s)
        # in the order written: the calls of one action change state
        turn.results = await self.run_calls(turn.calls, tools, in_order=True)
        if session.fault is not None:  # the worker failed (not a call): the episode ends with the fault
            raise session.fault
        step = ran_calls(turn)
        if step:
            self._steps.append(step)
        self.steps_in_turn += 1
        if self.steps_in_turn > self.step_limit:
            return None  # BFCL's force-quit: the reward's verdict fails the entry
        return [self.format.tool_message(r.call.name or "error", r.content, r.call.id) for r in turn.results]

    async def _end_user_turn(self, turn: Turn) -> list[dict[str, Any]] | None:
        """Close the current user turn (BFCL's per-turn checks, handed to the reward as ``turn.env_checks["bfcl"]``)
        and answer with the next one (``None``: done)."""
        session = self.session
        assert session is not None
        k = self.user_turn
        truth = self.task["ground_truth"][k]
        if truth:
            timeout = self.executor.default_timeout_s
            truth_results = [await session.call_ground_truth(s, timeout) for s in truth]
            v = await session.check_turn(session.results, truth_results, k, any(self._steps), timeout)
            turn.env_checks[CHECK_KEY] = TurnCheck(user_turn=k, valid=bool(v["valid"]), error_type=v["error_type"],
                                                   error=str(v["error"]))
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

    def close(self) -> None:
        """Stop the simulator process (the default reward's checker too: it is the same) and close the executor
        this env owns."""
        self.worker.close()
        super().close()

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
