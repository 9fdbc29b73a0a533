"""Play by hand: a person writes the assistant's turns and the env answers, through the env's own token-level API
(:meth:`~toolgym.envs.base.ToolEnv.encode_action`, then :meth:`~gymnasium.Env.step`), as a policy's sampled ids
would be answered. Each turn shows the parsed call(s), each tool's classified result, the turn's tokens decoded
in runs of equal loss mask (1: the assistant's, trained on; 0: the env's observation) and the reward, until the
episode ends.

One episode per browser tab (a session id the page makes); the server keeps at most :data:`MAX_SESSIONS`, the
least recently used is closed first, and a step on a closed one is a clear "expired" error.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

from trainers.ui.errors import UIError

__all__ = ["MAX_SESSIONS", "HandSessions", "token_runs"]

#: hand-played episodes kept at once (each holds a built env)
MAX_SESSIONS = 8
_SID = re.compile(r"[A-Za-z0-9_-]{8,64}")


def token_runs(tokenizer: Any, ids: list[int], mask: list[int]) -> list[dict[str, Any]]:
    """``ids`` decoded in maximal runs of equal ``mask`` value: ``[{"mask": 0 | 1, "text": str, "n": tokens}]``
    (special tokens kept, as the viewer shows them)."""
    out: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            text = tokenizer.decode(ids[start:i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            out.append({"mask": int(mask[start]), "text": text, "n": i - start})
            start = i
    return out


class _Session:
    def __init__(self, env: Any, env_id: str) -> None:
        self.env, self.env_id, self.done = env, env_id, False
        self.lock = threading.Lock()


class HandSessions:
    """The hand-played episodes, by session id; thread-safe; at most ``limit`` (least recently used closed)."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    @staticmethod
    def _sid(sid: str) -> str:
        if not isinstance(sid, str) or not _SID.fullmatch(sid):
            raise UIError("bad session id: 8-64 letters, digits, '-' or '_'")
        return sid

    def _drop(self, sid: str) -> None:
        s = self._sessions.pop(sid, None)
        if s is not None:
            try:
                s.env.close()
            except Exception:  # noqa: BLE001 - closing a dropped episode must not fail the one replacing it
                pass

    def reset(self, sid: str, env: str, *, seed: int | None = None, task: str = "", mcp_config: str = "",
              prompt: str = "") -> dict[str, Any]:
        """Start (or start over) session ``sid``'s episode of ``env``: the task drawn from ``seed`` (or the task
        ``task`` of a fixed task set). Returns ``{"session", "env", "task", "prompt_text", "tools", "example",
        "max_turns", "tasks"}``."""
        from trainers.ui.envcards import example_call, make_env, schemas_of, task_by_id, task_list

        sid = self._sid(sid)
        with self._lock:
            self._drop(sid)
        built = make_env(env, mcp_config=mcp_config, prompt=prompt)
        env_id = built.spec.id if built.spec is not None else env
        options = {"task": task_by_id(built, task)} if task else None
        try:
            _, info = built.reset(seed=seed, options=options)
        except Exception as e:  # noqa: BLE001 - a task the env refuses is one line on the page
            built.close()
            raise UIError(f"{env_id}: the episode did not start: {type(e).__name__}: {e}") from None
        with self._lock:
            self._sessions[sid] = _Session(built, env_id)
            while len(self._sessions) > self.limit:
                self._drop(next(iter(self._sessions)))
        u = built.unwrapped
        tools = schemas_of(u.tool_schemas)
        t = info.get("task") or {}
        users = [m.get("content") for m in info.get("messages") or [] if m.get("role") == "user"]
        prompt = t.get("prompt") or (users[-1] if users and isinstance(users[-1], str) else "")
        return {"session": sid, "env": env_id, "task": {"id": t.get("id"), "prompt": prompt},
                "prompt_text": info.get("prompt_text", ""), "tools": tools, "example": example_call(built, tools),
                "max_turns": getattr(u, "max_turns", None), "tasks": task_list(built, 200),
                "errors": info.get("errors") or {}}

    def _get(self, sid: str) -> _Session:
        sid = self._sid(sid)
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                raise UIError(f"this hand-played episode has expired (the server keeps the {self.limit} most "
                              "recent, and none across a restart): press Reset to start again")
            self._sessions.move_to_end(sid)
            return s

    def step(self, sid: str, text: str) -> dict[str, Any]:
        """Send ``text`` as the assistant's turn (encoded with the end-of-turn token, as a policy that stopped by
        itself). Returns ``{"turn", "text", "calls", "results", "tokens", "reward", "reward_components",
        "terminated", "truncated", "done", "outcome_reward", "outcome_components", "error"}``: ``tokens`` the
        turn's action and observation as :func:`token_runs`."""
        s = self._get(sid)
        with s.lock:
            if s.done:
                raise UIError("the episode has ended: press Reset to play another")
            u = s.env.unwrapped
            ids = u.encode_action(str(text or ""))
            _, reward, terminated, truncated, info = s.env.step(ids)
            s.done = bool(terminated or truncated)
            traj, conv = u.trajectory, u.conversation
            turn = traj.turns[-1] if traj is not None and traj.turns else None
            tokens: list[dict[str, Any]] = []
            if turn is not None and conv is not None:
                a, b = turn.action_start, max(turn.action_end, turn.obs_end)
                tokens = token_runs(u.tokenizer, list(conv.completion_ids[a:b]), list(conv.loss_mask[a:b]))
            out = {"turn": info.get("turn"), "text": turn.text if turn is not None else "",
                   "calls": info.get("calls", []), "results": info.get("results", []), "tokens": tokens,
                   "reward": float(reward), "reward_components": info.get("reward_components", {}),
                   "terminated": bool(terminated), "truncated": bool(truncated), "done": s.done,
                   "error": info.get("error") or ""}
            if s.done and traj is not None:
                out["outcome_reward"] = float(traj.outcome_reward)
                out["outcome_components"] = dict(traj.reward_components)
                out["answer"] = traj.answer
            return out

    def close(self) -> None:
        """Close every session's env."""
        with self._lock:
            for sid in list(self._sessions):
                self._drop(sid)
