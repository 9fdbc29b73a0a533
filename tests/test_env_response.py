"""``ToolEnv.env_response``: the public hook for what the environment answers to a turn (default: the parsed tool
calls' results; overridden: e.g. a simulated user, as in docs/extending.md)."""

from __future__ import annotations

import re

from toolgym import tool
from toolgym.envs.base import ToolEnv
from toolgym.envs.vector import ToolVectorEnv
from toolgym.rollout import RolloutDriver, ScriptedPolicy

GAMES = [{"id": f"guess-{n}", "prompt": "Guess my number from 1 to 100: <answer>N</answer>.", "secret": n}
         for n in (17, 64, 90)]


class GuessEnv(ToolEnv):
    """A simulated user says "Higher."/"Lower." until the guess is right."""

    def __init__(self, **kwargs):
        super().__init__(GAMES, [], reward=lambda t, task: float(t.answer.strip() == str(task["secret"])),
                         max_turns=kwargs.pop("max_turns", 8), **kwargs)

    async def env_response(self, turn):
        m = re.search(r"<answer>\s*(-?\d+)\s*</answer>", turn.text)
        if m and int(m.group(1)) == self.task["secret"]:
            return None
        hint = "Answer with a number." if m is None else "Higher." if int(m.group(1)) < self.task["secret"] else "Lower."
        return [{"role": "user", "content": hint}]


def test_a_simulated_user_answers_as_user_messages_masked_and_drift_free():
    env = GuessEnv()
    env.reset(options={"task": GAMES[0]})
    seen = []
    for guess in (50, 12, "?", 17):
        obs, reward, terminated, truncated, info = env.step(env.encode_action(f"<answer>{guess}</answer>"))
        seen.append((env.tokenizer.decode(obs), reward, terminated, truncated))
    assert [s[0].count(h) for s, h in zip(seen[:3], ("Lower.", "Higher.", "Answer with a number."), strict=True)] \
        == [1, 1, 1]
    assert all("<|im_start|>user" in s[0] for s in seen[:3])  # a user turn, then the next assistant header
    assert seen[3] == ("", 1.0, True, False)
    traj = info["trajectory"]
    assert [m["role"] for m in traj.messages] == ["user"] + ["assistant", "user"] * 3 + ["assistant"]
    assert traj.drift == {} and traj.reward == 1.0 and len(traj.turns) == 4
    # the user's tokens are context (mask 0), the guesses are the policy's (mask 1)
    for turn in traj.turns[:3]:
        assert set(traj.loss_mask[turn.obs_start:turn.obs_end]) == {0} and turn.obs_end > turn.obs_start
        assert set(traj.loss_mask[turn.action_start:turn.action_end]) == {1}
    assert all(t.results == [] and t.calls == [] for t in traj.turns)


def test_budgets_and_the_rollout_driver_apply_to_the_hook():
    env = GuessEnv(max_turns=2)
    env.reset(options={"task": GAMES[1]})
    env.step(env.encode_action("<answer>1</answer>"))
    *_, terminated, truncated, info = env.step(env.encode_action("<answer>2</answer>"))
    assert (terminated, truncated, info["trajectory"].reward) == (False, True, 0.0)
    # a binary-search "policy" through the driver: every game solved in <= 7 guesses

    def bisect(state) -> str:
        lo, hi = 1, 100
        for turn in state.trajectory.turns:
            guess = int(re.search(r"\d+", turn.text).group())
            reply = state.trajectory.messages[2 * turn.index + 2]["content"]
            lo, hi = (guess + 1, hi) if reply == "Higher." else (lo, guess - 1)
        return f"<answer>{(lo + hi) // 2}</answer>"

    venv = ToolVectorEnv(GuessEnv, num_envs=3)
    try:
        trajs = RolloutDriver(venv, ScriptedPolicy(bisect), max_turn_tokens=16).run(GAMES)
    finally:
        venv.close()
    assert [t.reward for t in trajs] == [1.0, 1.0, 1.0] and all(len(t.turns) <= 7 for t in trajs)


@tool
def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: first.
        b: second.
    """
    return str(a + b)


class ToolsAndUser(ToolEnv):
    """The default answer (tool results) plus a user's nudge in the same observation."""

    def __init__(self, **kwargs):
        super().__init__([{"id": "t", "prompt": "What is 2 + 3?"}], [add], max_turns=3, **kwargs)

    async def env_response(self, turn):
        msgs = await super().env_response(turn)
        return None if msgs is None else [*msgs, {"role": "user", "content": "Now answer."}]


def test_the_default_runs_tool_calls_and_an_override_can_extend_it():
    env = ToolsAndUser()
    env.reset(seed=0)
    obs, *_, info = env.step(env.encode_action(env.format.parser.format_calls([("add", {"a": 2, "b": 3})])))
    text = env.tokenizer.decode(obs)
    assert "5" in text and text.index("5") < text.index("Now answer.")
    assert [r["content"] for r in info["results"]] == ["5"]
    *_, terminated, _, info = env.step(env.encode_action("<answer>5</answer>"))
    assert terminated and info["trajectory"].drift == {}
    assert [m["role"] for m in info["trajectory"].messages][-4:] == ["assistant", "tool", "user", "assistant"]
