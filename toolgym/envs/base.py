"""ToolEnv: a Gymnasium env that speaks tokens.

``reset`` returns the prompt token ids; ``step(action_ids)`` decodes the policy's sampled ids, parses tool calls,
runs them concurrently through the :class:`~toolgym.tools.executor.ToolExecutor`, and returns the exact tokens to
append before the next assistant turn (or an empty array when the episode ends). See docs/design.md.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from toolgym import runtime
from toolgym.format.chat import ChatFormat
from toolgym.format.conversation import Conversation, as_int_array
from toolgym.format.parsers import ToolCallParser, template_family
from toolgym.format.vision import VisionFormat, vision_format
from toolgym.format.vision_conversation import VisionConversation
from toolgym.images import Image, ImageProblem, ref_placeholder, task_images
from toolgym.rewards.base import Reward, RewardLike, as_reward, outcome_score, turn_score
from toolgym.rewards.guard import DEFAULT_REWARD_TIMEOUT_S, RewardFault, guarded
from toolgym.tools.base import Seconds, Tool, ToolCall, ToolErrorKind, ToolResult, error_text
from toolgym.tools.executor import ToolExecutor
from toolgym.trajectory import Trajectory, Turn

__all__ = ["TaskSource", "ToolEnv"]

TaskSource = Sequence[Mapping[str, Any]] | Callable[[np.random.Generator], Mapping[str, Any]]

_EMPTY = np.zeros(0, dtype=np.int64)

#: default character bound per observation token (``max_obs_chars = OBS_CHARS_PER_TOKEN * max_obs_tokens``)
OBS_CHARS_PER_TOKEN = 32
#: conversations longer than this many tokens get their drift check (a full re-render and re-tokenisation) in a
#: worker thread, so a huge action or episode never freezes the other episodes on the runtime loop
DRIFT_OFF_LOOP_TOKENS = 16384
TRUNCATED_MARK = " …[truncated]"
#: default of ``ToolEnv(max_calls_per_turn=...)``: tool calls run per assistant turn
DEFAULT_MAX_CALLS_PER_TURN = 32

logger = logging.getLogger(__name__)


def _template_renders_tools(tokenizer: Any) -> bool:
    """The tokenizer's own template can carry an episode: it renders tools, or it is a known family's (e.g.
    DeepSeek-V3's, which writes tool calls but never shows the tools: the chat format lists them itself)."""
    tmpl = getattr(tokenizer, "chat_template", None)
    return isinstance(tmpl, str) and (("tools" in tmpl and "tool" in tmpl) or template_family(tmpl) is not None)


class ToolEnv(gym.Env[np.ndarray, np.ndarray]):
    """A tool-use task as a token-level Gymnasium env.

    Args:
        tasks: a sequence of task rows, or ``fn(np_random) -> row`` for procedural tasks. A row has ``"id"``,
            ``"prompt"`` (the user text) or ``"messages"`` (a chat list), optionally ``"images"`` (a list of PIL
            images, :class:`~toolgym.images.Image`, bytes, ``data:`` URIs or file paths, checked at reset:
            :func:`~toolgym.images.task_images`), plus whatever the reward needs.
        tools: the tools the model may call (ignored when ``executor`` is given).
        reward: a :class:`~toolgym.rewards.base.Reward` or ``fn(trajectory, task) -> float | Score``; the components of
            its :class:`~toolgym.rewards.base.Score` go to ``info["reward_components"]`` and the trajectory.
        tokenizer: a Hugging Face tokenizer or a name/path; ``None`` = the embedded SmolLM2 tokenizer.
        chat_template: a Jinja template overriding the tokenizer's (``None``: the tokenizer's own if it renders
            tools or is a known family's, else toolgym's ChatML tool template).
        parser: the tool-call format: a registered name (vLLM's: ``"hermes"``, ``"llama3_json"``, ``"qwen3_coder"``,
            ``"deepseek_v3"``, ``"openai"``, ``"mistral"``, ``"glm45"``, ``"gemma4"``, ``"kimi_k2"``, ``"deepseek_v32"``,
            ``"minimax_m2"``, ``"pythonic"``, ...), a parser instance, or
            ``"auto"`` (from the chat template; see docs/families.md).
        system_prompt: prepended as a system message (unless the task brings its own messages).
        max_turns: assistant turns per episode; reaching it with tool calls pending truncates the episode.
        max_episode_tokens: prompt + completion token budget; an observation that would cross it truncates.
        max_obs_tokens: each tool result is cut to this many tokens (a ``[truncated]`` marker is appended).
        max_obs_chars: each tool result is first cut to this many characters, before anything is tokenised
            (``None``: ``OBS_CHARS_PER_TOKEN`` (32) x ``max_obs_tokens``), so a megabyte result costs what a
            short one does. A result whose first ``max_obs_chars`` characters make fewer than ``max_obs_tokens``
            tokens (tokens longer than 32 characters on average) is shown shorter than ``max_obs_tokens``.
        executor: a shared executor (vector envs pass one); else one is built from ``tools`` + ``executor_kwargs``.
        owns_executor: whether :meth:`close` closes the executor's tools (``None``: only when the env built it).
            A caller that shares an env's own executor takes it over with :meth:`share_executor`.
        template_kwargs: extra chat-template variables (e.g. ``{"enable_thinking": False}``).
        eot_token: the end-of-turn token text (``None``: guessed from the vocabulary).
        max_calls_per_turn: tool calls run per assistant turn (default 32); the calls past it are not run, each is
            answered with a ``call_limit`` error (every call still gets exactly one result).
        reward_timeout_s: seconds one reward call (outcome, or one turn's) may take (default 300; ``None``: no
            limit). A reward that times out, raises or returns a non-finite score scores 0 for that episode, which
            ends truncated, with the error in ``info["error"]``, ``Trajectory.errors`` (``reward_timeout`` / ``reward_exception`` / ``reward_non_finite``) and
            ``info["errors"]``; the other episodes are untouched (see :mod:`toolgym.rewards.guard`).
        processor: a Hugging Face multimodal processor (Qwen3-VL, Qwen2.5-VL, Gemma 3; docs/multimodal.md): task and
            tool-result images become the model's image tokens at the processor's count
            (:class:`~toolgym.format.vision_conversation.VisionConversation`); its tokenizer, its family's chat
            template and tool-call parser are the defaults of ``tokenizer``, ``chat_template`` and ``parser``.
            A path (``str``) is loaded with :func:`toolgym.processors.load_processor` (a config file's
            ``env_kwargs.processor``). ``None``: text only, each image read as its placeholder line.

    A prompt that alone fills ``max_episode_tokens`` ends its episode truncated at the first step, before the
    action is applied: no tool runs, no reward is computed, and ``Trajectory.errors["prompt_too_long"]`` says why.

    Spaces: observations and actions are 1-D ``np.int64`` arrays of token ids of any length
    (``Sequence(Discrete(vocab_size), stack=True)``). Ids outside the vocabulary in an action are ignored when
    decoding but kept in the trajectory.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        tasks: TaskSource,
        tools: Sequence[Tool] = (),
        *,
        reward: RewardLike | None = None,
        tokenizer: Any = None,
        chat_template: str | None = None,
        parser: str | ToolCallParser = "auto",
        system_prompt: str | None = None,
        max_turns: int = 4,
        max_episode_tokens: int = 2048,
        max_obs_tokens: int = 512,
        max_obs_chars: int | None = None,
        executor: ToolExecutor | None = None,
        executor_kwargs: Mapping[str, Any] | None = None,
        owns_executor: bool | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        eot_token: str | None = None,
        render_mode: str | None = None,
        reward_timeout_s: float | None = DEFAULT_REWARD_TIMEOUT_S,
        max_calls_per_turn: int = DEFAULT_MAX_CALLS_PER_TURN,
        processor: Any = None,
    ) -> None:
        for name, value in (("max_turns", max_turns), ("max_episode_tokens", max_episode_tokens),
                            ("max_obs_tokens", max_obs_tokens), ("max_calls_per_turn", max_calls_per_turn)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.vision: VisionFormat | None = None
        if isinstance(processor, str):  # a processor directory, from a config file or the command line
            from toolgym.processors import load_processor

            processor = load_processor(processor)
        if processor is not None:  # a vision-language model: images become its image tokens
            self.vision = vision_format(processor)
            tokenizer = self.vision.tokenizer if tokenizer is None else tokenizer
            chat_template = self.vision.family.chat_template() if chat_template is None else chat_template
            parser = self.vision.family.parser if parser == "auto" else parser
        if tokenizer is None or isinstance(tokenizer, str):
            from toolgym.models import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        if chat_template is None and not _template_renders_tools(tokenizer):
            from toolgym.models import chatml_tools_template

            chat_template = chatml_tools_template()
        if not callable(tasks) and len(tasks) == 0:
            raise ValueError("ToolEnv needs at least one task")
        self.tasks = tasks
        self.tokenizer = tokenizer
        self.format = ChatFormat(tokenizer, chat_template, parser, eot_token, dict(template_kwargs or {}))
        self.owns_executor = executor is None if owns_executor is None else bool(owns_executor)
        self.executor = executor if executor is not None else ToolExecutor(tools, **dict(executor_kwargs or {}))
        self.reward: Reward | None = as_reward(reward)
        self.system_prompt = system_prompt
        if reward_timeout_s is not None and not reward_timeout_s > 0:
            raise ValueError(f"reward_timeout_s must be positive or None, got {reward_timeout_s!r}")
        self.reward_timeout_s = reward_timeout_s
        self.max_calls_per_turn = int(max_calls_per_turn)
        self.max_turns = max_turns
        self.max_episode_tokens = max_episode_tokens
        self.max_obs_tokens = max_obs_tokens
        self.max_obs_chars = max_obs_chars if max_obs_chars is not None else OBS_CHARS_PER_TOKEN * max_obs_tokens
        self.render_mode = render_mode
        vocab = len(tokenizer)
        self.observation_space = spaces.Sequence(spaces.Discrete(vocab), stack=True)
        self.action_space = spaces.Sequence(spaces.Discrete(vocab), stack=True)
        self.conversation: Conversation | None = None
        self.trajectory: Trajectory | None = None
        self.task: dict[str, Any] = {}
        self._done = True

    # -- tasks and prompts ------------------------------------------------------------------------
    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tool specs shown to the model (all tools of the executor)."""
        return self.executor.schemas()

    def sample_task(self) -> dict[str, Any]:
        """Draw a task with ``self.np_random`` (deterministic under ``reset(seed=...)``)."""
        if callable(self.tasks):
            return dict(self.tasks(self.np_random))
        return dict(self.tasks[int(self.np_random.integers(len(self.tasks)))])

    def build_messages(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The opening chat messages for ``task``: the task's ``messages``, or system prompt + ``prompt``. A task
        with ``images`` (see :meth:`reset`) has their placeholders, one line each, before the first user text."""
        if "messages" in task:
            msgs = [dict(m) for m in task["messages"]]
        else:
            msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            msgs.append({"role": "user", "content": str(task["prompt"])})
        lines = [ref_placeholder(ref) for ref in task.get("images") or ()]
        user = next((m for m in msgs if m.get("role") == "user" and isinstance(m.get("content"), str)), None)
        if lines and user is not None:
            user["content"] = "\n".join([*lines, user["content"]])
        return msgs

    # -- gym API ----------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode. ``options={"task": row}`` picks the task; else one is drawn from the seed.

        Returns ``(prompt_ids, info)`` with ``info["task"]``, ``info["messages"]`` and ``info["prompt_text"]``.
        """
        super().reset(seed=seed)
        task = options["task"] if options and options.get("task") is not None else self.sample_task()
        task = copy.deepcopy(dict(task))  # the episode owns its row: nothing is shared with the task set
        images = task_images(task, self.executor.image_limits)  # task["images"] become refs; ImageError if bad
        self.task = task
        if self.vision is not None:
            conv: Conversation = VisionConversation(self.format, self.vision, self.build_messages(task),
                                                    self.tool_schemas, images)
        else:
            conv = Conversation(self.format, self.build_messages(task), self.tool_schemas)
        self.conversation = conv
        self.trajectory = Trajectory(prompt_ids=conv.prompt_ids, task=task, prompt_images=images)
        self._done = False
        info = {"task": task, "messages": [dict(m) for m in conv.messages], "prompt_text": conv.prompt_text}
        if len(conv.prompt_ids) >= self.max_episode_tokens:
            self.trajectory.errors["prompt_too_long"] = (
                f"the prompt has {len(conv.prompt_ids)} tokens; the episode's budget (max_episode_tokens) is "
                f"{self.max_episode_tokens}: no room for a turn"
            )
            info["errors"] = dict(self.trajectory.errors)
        return as_int_array(conv.prompt_ids), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Sync :meth:`astep`: one hop to the toolgym runtime loop, where the tools run."""
        return runtime.run_sync(self.astep(action))

    async def astep(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Apply one assistant turn.

        Args:
            action: 1-D int array of the ids the policy sampled this turn, ending with the end-of-turn token if
                it stopped by itself (otherwise the turn counts as cut by its budget).

        Returns:
            ``(obs, reward, terminated, truncated, info)``: ``obs`` the ids to append before the next assistant turn
            (empty when the episode ends); ``reward`` this turn's process reward, plus the outcome reward on the
            last step; ``terminated`` when the model answered without calling a tool; ``truncated`` when the turn
            or token budget ran out. ``info``: ``calls``, ``results``, ``error_kinds``, ``latencies_s``,
            ``reward_components``, ``turn``; on the last step also ``trajectory`` and ``drift``.
        """
        if self._done or self.conversation is None or self.trajectory is None:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        t0 = time.perf_counter()
        try:
            return await self._astep(action, t0)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a fault ends this episode (truncated), never the caller's batch
            logger.exception("toolgym: episode ended by an error in step")
            return self.fail_episode(e, t0)

    def fail_episode(self, exc: BaseException, t0: float | None = None) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """End the episode as truncated after an unexpected error in :meth:`astep`; ``info["error"]`` says why and
        ``info["trajectory"]`` holds what was recorded (the failed turn included when it was appended; no drift check,
        no outcome reward)."""
        t0 = time.perf_counter() if t0 is None else t0
        self._done = True
        traj, conv = self.trajectory, self.conversation
        assert traj is not None and conv is not None
        traj.truncated = True
        traj.completion_ids, traj.loss_mask, traj.messages = conv.completion_ids, conv.loss_mask, conv.messages
        err = f"{type(exc).__name__}: {exc}"
        info: dict[str, Any] = {
            "turn": len(traj.turns) - 1, "error": err, "trajectory": traj, "drift": traj.drift,
            "outcome_reward": traj.outcome_reward, "env_time_s": Seconds(time.perf_counter() - t0),
        }
        return _EMPTY, 0.0, False, True, info

    def _bounded_observation(self, answer: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
        """The env's answer as messages and their observation tokens, each message's content bounded by
        ``max_obs_chars`` characters (before anything is tokenised: megabytes stay cheap), then by tokens."""
        conv = self.conversation
        assert conv is not None
        msgs = [{**m, "content": str(m.get("content", ""))} for m in answer]
        for m in msgs:
            if len(m["content"]) > self.max_obs_chars:
                m["content"] = m["content"][: self.max_obs_chars] + TRUNCATED_MARK
        obs_ids = conv.observation(msgs)
        if self._may_need_clip(msgs, obs_ids):  # rare: measure each message alone, cut, re-encode
            msgs = [{**m, "content": self._clip(m["content"])} for m in msgs]
            obs_ids = conv.observation(msgs)
        return msgs, obs_ids

    async def _astep(self, action: Any, t0: float) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        conv, traj = self.conversation, self.trajectory
        assert conv is not None and traj is not None
        if "prompt_too_long" in traj.errors:  # no room for any turn: end here, not as the model's answer
            self._done = True
            traj.truncated = True
            info: dict[str, Any] = {
                "turn": -1, "trajectory": traj, "drift": traj.drift, "outcome_reward": traj.outcome_reward,
                "errors": dict(traj.errors), "error": traj.errors["prompt_too_long"],
                "env_time_s": Seconds(time.perf_counter() - t0),
            }
            return _EMPTY, 0.0, False, True, info
        ids = np.asarray(action).reshape(-1).astype(np.int64, copy=False).tolist() if np.size(action) else []
        text, parsed, cut, (a0, a1) = conv.add_action(ids)
        turn = Turn(
            index=len(traj.turns), action_start=a0, action_end=a1, obs_start=a1, obs_end=a1, text=text,
            content=parsed.content, reasoning=parsed.reasoning, calls=parsed.calls, cut=cut,
        )
        traj.turns.append(turn)

        terminated = truncated = False
        obs = _EMPTY
        answer = await self.env_response(turn)
        if answer is not None:
            msgs, obs_ids = self._bounded_observation(answer)
            if turn.index + 1 >= self.max_turns:
                truncated = True
            elif len(conv) + len(obs_ids) >= self.max_episode_tokens:
                truncated = True
            else:
                turn.obs_start, turn.obs_end = conv.add_observation(msgs, obs_ids)
                obs = as_int_array(obs_ids)
                turn.obs_images = _answer_images(msgs, turn)
        else:
            terminated = True
        if not (terminated or truncated) and len(conv) >= self.max_episode_tokens:
            truncated = True

        reward = 0.0
        if self.reward is not None and self.reward.per_turn:
            score, _ = await self._score(turn_score(self.reward, turn, traj, self.task))
            turn.reward, turn.reward_components = score.value, dict(score.components)
            reward += turn.reward
        done = terminated or truncated
        info = {
            "turn": turn.index,
            "calls": [c.to_dict() for c in turn.calls],
            "results": [r.to_dict() for r in turn.results],
            "error_kinds": turn.error_kinds,
            "latencies_s": [Seconds(r.latency_s) for r in turn.results],
            "reward_components": dict(turn.reward_components),
            "cut": cut,
        }
        traj.completion_ids = conv.completion_ids
        traj.loss_mask = conv.loss_mask
        traj.messages = conv.messages
        if done:
            self._done = True
            traj.terminated, traj.truncated = terminated, truncated
            if self.reward is not None:
                score, fault = await self._score(outcome_score(self.reward, traj, self.task))
                traj.outcome_reward, traj.reward_components = score.value, dict(score.components)
                reward += traj.outcome_reward
                if fault is not None:  # no trustworthy outcome: the episode ends truncated, as on any env fault
                    terminated, truncated = False, True
                    traj.terminated, traj.truncated = terminated, truncated
                    info["error"] = fault.message
            if len(conv) > DRIFT_OFF_LOOP_TOKENS:
                traj.drift = await asyncio.to_thread(conv.check_drift)
            else:
                traj.drift = conv.check_drift()
            info["trajectory"] = traj
            info["drift"] = traj.drift
            info["outcome_reward"] = traj.outcome_reward
        if traj.errors:
            info["errors"] = dict(traj.errors)
        info["env_time_s"] = Seconds(time.perf_counter() - t0)
        return obs, reward, terminated, truncated, info

    async def _score(self, call: Any) -> tuple[Any, RewardFault | None]:
        """One reward call under the reward time limit, on the runtime loop: ``(Score, fault or None)``; a fault is
        recorded in ``Trajectory.errors`` and scores 0 (:func:`toolgym.rewards.guard.guarded`)."""
        assert self.reward is not None and self.trajectory is not None
        score, fault = await runtime.run_async(guarded(call, self.reward.name, self.reward_timeout_s))
        if fault is not None:
            logger.warning("toolgym: %s", fault.message)
            self.trajectory.errors.setdefault(fault.key, fault.message)
        return score, fault

    # -- the environment's answer to a turn --------------------------------------------------------
    async def env_response(self, turn: Turn) -> list[dict[str, Any]] | None:
        """The environment's answer to the assistant turn ``turn`` (verifiers' name for this hook): the chat
        messages to append before the model's next turn, or ``None`` to end the episode (the model answered:
        ``terminated``).

        Default: run the turn's parsed tool calls (``turn.calls``, at most ``max_calls_per_turn``; the others get a
        ``call_limit`` error result) with the env's executor, record them in
        ``turn.results``, and answer with one tool message per result
        (``self.format.tool_message(name, content, call_id)``, with the result's images under ``"images"``);
        ``None`` when the turn has no calls. Override it for an env that answers otherwise, e.g. a simulated user
        (a ``{"role": "user", "content": ...}`` message; ``docs/extending.md`` has one). A message's ``"images"``
        (:class:`~toolgym.images.Image` objects, each placeholder in its content) are shown as image tokens with a
        ``processor``, and as the placeholders otherwise. ``turn.text`` / ``turn.content`` hold what the model wrote,
        ``self.task`` the task row, ``self.trajectory`` the episode so far. Whatever it returns is bounded
        (``max_obs_chars``, ``max_obs_tokens`` per message), tokenised with the chat template (loss mask 0) and
        checked by the drift check like tool results; the turn and token budgets apply as for tool results.
        """
        if not turn.calls:
            return None
        turn.results = await self.run_calls(turn.calls)
        msgs = [self.format.tool_message(r.call.name or "error", r.content, r.call.id) for r in turn.results]
        for m, r in zip(msgs, turn.results, strict=True):
            if r.images:  # shown as image tokens by a vision-language env; a text-only one reads the placeholders
                m["images"] = list(r.images)
        return msgs

    async def run_calls(self, calls: Sequence[ToolCall], tools: Mapping[str, Tool] | None = None, *,
                        in_order: bool = False) -> list[ToolResult]:
        """One result per call of ``calls``, run by the env's executor: at most ``max_calls_per_turn`` run (the
        others get a ``call_limit`` error result), each result's content bounded by ``max_obs_chars`` characters
        (what the model is shown and the trajectory records). ``tools`` / ``in_order``: an episode's own tools and
        ordered execution (:meth:`~toolgym.tools.executor.ToolExecutor.run_many`). :meth:`env_response` uses it; so
        does an override that runs tools of its own (BFCL's simulators). The turn's results show at most
        ``executor.image_limits.max_per_turn`` images in all: a result past it keeps the images that fit and
        becomes ``invalid_image``, naming each image not shown (its text kept)."""
        cap = self.max_calls_per_turn
        results = await runtime.run_async(self.executor.run_many(calls[:cap], tools, in_order=in_order))
        if len(calls) > cap:
            why = error_text(ToolErrorKind.CALL_LIMIT, f"not run: this turn made {len(calls)} tool calls and at "
                                                       f"most {cap} run per turn")
            results += [ToolResult(c, why, ToolErrorKind.CALL_LIMIT) for c in calls[cap:]]
        shown, limit = 0, self.executor.image_limits.max_per_turn
        for r in results:
            if r.images and shown + len(r.images) > limit:  # past the turn's images: refused, named, text kept
                kept, cut = r.images[: max(limit - shown, 0)], r.images[max(limit - shown, 0):]
                names = ", ".join(f"{img.placeholder} sha256 {img.sha256[:12]}" for img in cut)
                why = (f"{ImageProblem.TOO_MANY.value}: {len(cut)} image(s) not shown, past the limit of {limit} "
                       f"per turn: {names}")
                r.content = (error_text(ToolErrorKind.INVALID_IMAGE, f"{why}\n{r.content}") if r.error_kind is None
                             else f"{r.content}\n{why}")  # already invalid_image: one more problem
                r.images, r.error_kind = kept, ToolErrorKind.INVALID_IMAGE
            shown += len(r.images)
        for r in results:  # the recorded results are bounded too (what the model is shown)
            if len(r.content) > self.max_obs_chars:
                r.content = r.content[: self.max_obs_chars] + TRUNCATED_MARK
        return results

    def _may_need_clip(self, msgs: Sequence[Mapping[str, Any]], obs_ids: Sequence[int]) -> bool:
        """``False`` when no message can be longer than ``max_obs_tokens`` tokens: every content is at most that
        many bytes, or the observation, less its fixed framing, has a few tokens to spare (each message is
        encoded alone only when this says ``True``: one encode per step instead of two)."""
        limit = self.max_obs_tokens
        if all(len(str(m["content"]).encode("utf-8", "replace")) <= limit for m in msgs):
            return False
        frame = self.format.observation_frame_len(msgs)
        return len(obs_ids) - frame > limit - 4  # 4: tokens a message may gain alone at its two boundaries

    def _clip(self, text: str) -> str:
        """``text`` cut to ``max_obs_chars`` characters, then to ``max_obs_tokens`` tokens, with a ``[truncated]``
        marker when cut."""
        if len(text.encode("utf-8", "replace")) <= self.max_obs_tokens:
            return text
        cut = len(text) > self.max_obs_chars
        if cut:
            text = text[: self.max_obs_chars]
        ids = self.format.encode(text)
        if len(ids) <= self.max_obs_tokens:
            return text + TRUNCATED_MARK if cut else text
        return self.tokenizer.decode(ids[: self.max_obs_tokens], skip_special_tokens=False) + TRUNCATED_MARK

    # -- oracle -----------------------------------------------------------------------------------
    def oracle(self, state: Any) -> str:
        """The text a policy that solves the task writes for turn ``state.turn`` (tool calls in this env's
        format via ``self.format.parser.format_calls``, then the answer in the env's answer format).

        ``state`` is a :class:`toolgym.rollout.EpisodeState`: ``state.task`` is the task row, ``state.turn`` the
        0-based turn, ``state.trajectory`` the episode so far (read the tool results from its last turn).
        Oracles serve smoke tests (``toolgym eval ENV --policy oracle``) and SFT data
        (:func:`toolgym.evaluation.oracle_policy`). The built-in envs define one; a user env overrides this method.

        Raises:
            NotImplementedError: this env defines no oracle.
        """
        name = getattr(getattr(self, "spec", None), "id", None) or type(self).__name__
        raise NotImplementedError(
            f"no oracle for env {name!r} ({type(self).__name__}): define oracle(self, state) -> str on the env "
            "(see docs/extending.md)"
        )

    @staticmethod
    def last_results(state: Any) -> list[Any]:
        """The :class:`~toolgym.tools.base.ToolResult` list of the episode's last turn (``[]`` before the first
        turn or when it called no tool): what an oracle reads before its next turn."""
        traj = state.trajectory
        return list(traj.turns[-1].results) if traj is not None and traj.turns else []

    # -- helpers ----------------------------------------------------------------------------------
    def encode_action(self, text: str, end_turn: bool = True) -> np.ndarray:
        """The ids a policy would sample to write ``text`` (plus the end-of-turn token): for scripted policies."""
        ids = self.format.encode(text)
        if end_turn:
            ids.append(self.format.eot_id)
        return as_int_array(ids)

    def render(self) -> str | None:
        """``ansi``: the conversation so far as text."""
        if self.render_mode != "ansi" or self.conversation is None:
            return None
        c = self.conversation
        return self.format.decode(c.prompt_ids + c.completion_ids)

    def share_executor(self) -> ToolExecutor:
        """Hand this env's executor over to a caller that shares it with other envs (e.g.
        :class:`~toolgym.envs.vector.ToolVectorEnv`): the env keeps using it, but :meth:`close` no longer closes it; the
        caller does. Returns the executor (pass it as ``executor=`` to the other envs)."""
        self.owns_executor = False
        return self.executor

    def close(self) -> None:
        """Close the tools of an executor this env owns (shared executors are closed by their vector env)."""
        if self.owns_executor and self.executor is not None and self.executor.tools:
            try:
                runtime.run_sync(self.executor.aclose())
            except Exception:  # noqa: BLE001
                pass
        super().close()


def _answer_images(msgs: Sequence[Mapping[str, Any]], turn: Turn) -> list[Image]:
    """The images of the env's answer ``msgs`` that are not ``turn``'s tool results' images, each once, in order:
    what the trajectory must keep beside the results so that a saved episode holds every image its model saw."""
    seen = {img.sha256 for r in turn.results for img in r.images}
    out: list[Image] = []
    for m in msgs:
        for img in m.get("images") or ():
            if img.sha256 not in seen:
                seen.add(img.sha256)
                out.append(img)
    return out
