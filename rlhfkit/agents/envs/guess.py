"""A multi-turn guessing game: the model guesses the secret number (the prompt's label).

Each turn the first whole number in the action is the guess. Feedback: "higher" / "lower" (or
"say a number") and a new turn; a right guess ends the episode with reward
`1 - TURN_PENALTY * (turn - 1)` (faster is better) and score 1; running out of turns scores 0.

    --agent.func_path builtin:guess   (labels: the secret numbers)
"""

from __future__ import annotations

from rlhfkit.agents import AgentInstanceBase
from rlhfkit.rewards.math import extract_first_integer

TURN_PENALTY = 0.2
MAX_GUESSES = 4


def guess_feedback(action: str, secret: int) -> tuple[str, bool]:
    """(feedback text, solved) for one guess: "64" vs 70 gives ("\\nhigher\\n", False)."""
    guess = extract_first_integer(action)
    if guess is None:
        return "\nsay a number\n", False
    if guess == secret:
        return "\ncorrect\n", True
    return ("\nhigher\n" if guess < secret else "\nlower\n"), False


class AgentInstance(AgentInstanceBase):
    def __init__(self, *args, **kwargs):
        self.turn = 0

    async def step(self, states: dict, **kwargs) -> dict:
        self.turn += 1
        secret = int(states["label"])
        feedback, solved = guess_feedback(states["action_text"], secret)
        done = solved or self.turn >= MAX_GUESSES
        reward = 1.0 - TURN_PENALTY * (self.turn - 1) if solved else 0.0
        return {"rewards": reward, "scores": 1.0 if solved else 0.0, "environment_feedback": feedback,
                "done": done, "extra_logs": {"solved": float(solved), "guesses": float(self.turn)}}
