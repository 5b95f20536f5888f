"""A ready-made reward file for code datasets: each label holds the tests of its prompt.

Use it as `--reward.remote_url builtin:code` (which runs it with the --reward.code.* settings), or
copy this file and change the settings below. The label of a prompt (`--data.label_key`) is assert
source, a JSON list of assert sources, or JSON / a dict with "tests", or "inputs"/"outputs"
(stdin -> stdout), or "fn_name" + "inputs"/"outputs" (call and compare), as APPS/TACO give
`input_output`; see docs/code_rewards.md. Each response is the part of its query after the prompt; its
last ```python block (else the whole response) is run against each test in the code sandbox
(`rlhfkit.rewards.code`; bubblewrap by default). Reward: 1.0 when every test passes, else 0.0 (PARTIAL_CREDIT: the
fraction passed).
"""

from __future__ import annotations

from typing import Any

from rlhfkit.rewards.code import CodeReward

PARTIAL_CREDIT = False
SANDBOX = "bwrap"  # or "none" (unconfined); "remote" needs REMOTE_URL
REMOTE_URL = None
TIMEOUT = 5.0
_REWARD: CodeReward | None = None


def reward_func(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> dict[str, Any]:
    """OpenRLHF-style reward over code responses.

    Returns {"rewards": FloatTensor [B], "scores": FloatTensor [B] (all tests passed),
             "extra_logs": {"timed_out": [B], "pass_fraction": [B]}}.
    """
    global _REWARD
    if _REWARD is None:
        _REWARD = CodeReward(partial_credit=PARTIAL_CREDIT, sandbox=SANDBOX, remote_url=REMOTE_URL,
                              timeout=TIMEOUT)
    out = _REWARD(queries, prompts, labels)
    return {"rewards": out.rewards, "scores": out.scores, "extra_logs": dict(out.extra_logs)}
