"""Per-step rewards of a process reward model (rewards/reward_model.py, base.py) and their wire format
(rewards/remote.py): the aggregates and token placement by hand, rows of an output, and the client's checks of
a server's "step_rewards" / "step_ends"."""

import math

import pytest
import torch
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from rlhfkit.config.serve import PRM_AGGREGATES
from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardOutput, concat_outputs, normalize_reward_output
from rlhfkit.rewards.remote import RemoteRewardFn
from rlhfkit.rewards.reward_model import STEP_AGGREGATES, aggregate_steps, step_token_rewards
from tests.unit.rewards.test_remote_reward import Server


def test_aggregates_by_hand():
    probs = [torch.tensor([0.5, 0.25, 0.8]), torch.tensor([0.9]), torch.tensor([])]
    want = {"min": [0.25, 0.9, 0.0], "prod": [0.1, 0.9, 0.0], "mean": [1.55 / 3, 0.9, 0.0], "last": [0.8, 0.9, 0.0]}
    for rule, values in want.items():
        assert aggregate_steps(probs, rule).tolist() == pytest.approx(values, rel=1e-6), rule
    assert tuple(STEP_AGGREGATES) == PRM_AGGREGATES  # the flag's choices are the table's


def test_step_scores_land_on_their_ends():
    token = step_token_rewards([torch.tensor([0.5, 0.25]), torch.tensor([]), torch.tensor([0.75])],
                               [torch.tensor([1, 3]), torch.tensor([], dtype=torch.long), torch.tensor([0])], 4)
    assert token.tolist() == [[0.0, 0.5, 0.0, 0.25], [0.0] * 4, [0.75, 0.0, 0.0, 0.0]]


def test_rows_of_an_output_keep_their_steps():
    out = RewardOutput(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0]), {"x": torch.tensor([7.0, 8, 9])},
                       [torch.tensor([0.1]), torch.tensor([]), torch.tensor([0.2, 0.3])],
                       [torch.tensor([0]), torch.tensor([], dtype=torch.long), torch.tensor([1, 4])])
    picked = out.select([2, 0, 2])
    assert picked.rewards.tolist() == [3.0, 1.0, 3.0] and picked.extra_logs["x"].tolist() == [9.0, 7.0, 9.0]
    assert [s.tolist() for s in picked.steps] == [pytest.approx([0.2, 0.3]), pytest.approx([0.1]),
                                                  pytest.approx([0.2, 0.3])]
    assert [e.tolist() for e in out.select(slice(1, 3)).step_ends] == [[], [1, 4]]
    both = concat_outputs([out.select(slice(0, 1)), out.select(slice(1, 3))])
    assert both.scores.tolist() == [4.0, 5.0, 6.0] and [e.tolist() for e in both.step_ends] == [[0], [], [1, 4]]
    plain = concat_outputs([out.select(slice(0, 1)), RewardOutput(torch.tensor([0.0]), torch.tensor([0.0]))])
    assert plain.steps is None and plain.extra_logs["x"].tolist() == [7.0, 0.0]


def test_an_extra_log_may_be_not_applicable_but_rewards_may_not():
    out = normalize_reward_output({"rewards": [1.0, 2.0], "extra_logs": {"m": [None, 0.5]}}, 2, "f")
    assert math.isnan(out.extra_logs["m"][0]) and out.extra_logs["m"][1] == 0.5
    with pytest.raises(RewardError, match="non-finite value in extra_logs\\['m'\\] at index 0"):
        normalize_reward_output({"rewards": [1.0], "extra_logs": {"m": [float("inf")]}}, 1, "f")
    with pytest.raises(RewardError, match="NoneType at index 0"):
        normalize_reward_output({"rewards": [None]}, 1, "f")


ANSWERS = {
    "good": '{"rewards": [0.5, 0.0], "step_rewards": [[0.5, 0.75], []], "step_ends": [[0, 2], []]}',
    "short": '{"rewards": [0.5, 0.0], "step_rewards": [[0.5]], "step_ends": [[0], []]}',
    "words": '{"rewards": [0.5, 0.0], "step_rewards": [["high"], []], "step_ends": [[0], []]}',
    "nan": '{"rewards": [0.5, 0.0], "step_rewards": [[NaN], []], "step_ends": [[0], []]}',
    "no_ends": '{"rewards": [0.5, 0.0], "step_rewards": [[0.5], []]}',
    "outside": '{"rewards": [0.5, 0.0], "step_rewards": [[0.5], []], "step_ends": [[3], []]}',
    "backwards": '{"rewards": [0.5, 0.0], "step_rewards": [[0.5, 0.75], []], "step_ends": [[2, 0], []]}',
    "miscount": '{"rewards": [0.5, 0.0], "step_rewards": [[0.5, 0.75], []], "step_ends": [[0], []]}',
}


@pytest.fixture(scope="module")
def prm_answers():
    """A server answering each of ANSWERS at /NAME; `app.state.seen` keeps the requests' bodies."""
    app = FastAPI()
    app.state.seen = []

    def route(text):
        async def answer(request: Request):
            app.state.seen.append(await request.json())
            return PlainTextResponse(text, media_type="application/json")
        return answer

    for name, text in ANSWERS.items():
        app.post(f"/{name}")(route(text))
    server = Server(app)
    yield server.url.rsplit("/", 1)[0], app.state.seen
    server.stop()


CALL = (["q:abc", "p:"], ["q:", "p:"], [None, None])
IDS = {"prompt_ids": [[5, 6], [7]], "completion_ids": [[1, 2, 3], []]}


def test_the_client_sends_token_ids_with_a_vocabulary_and_checks_the_steps(prm_answers):
    base, seen = prm_answers
    out = RemoteRewardFn([f"{base}/good"]).with_vocab("abc")(*CALL, **IDS)
    assert seen[-1]["prompt_ids"] == [[5, 6], [7]] and seen[-1]["response_ids"] == [[1, 2, 3], []]
    assert seen[-1]["vocab"] == "abc" and seen[-1]["query"] == CALL[0]
    assert [s.tolist() for s in out.steps] == [[0.5, 0.75], []] and [e.tolist() for e in out.step_ends] == [[0, 2], []]
    assert out.rewards.tolist() == [0.5, 0.0]
    plain = RemoteRewardFn([f"{base}/good"])(*CALL, **IDS)  # no vocabulary: text alone, no step ends kept
    assert "response_ids" not in seen[-1] and "vocab" not in seen[-1]
    assert plain.step_ends is None and [s.tolist() for s in plain.steps] == [[0.5, 0.75], []]


@pytest.mark.parametrize("name, message", [
    ("short", "answered step_rewards that are not 2 lists of finite numbers"),
    ("words", "answered step_rewards that are not 2 lists of finite numbers"),
    ("nan", "answered step_rewards that are not 2 lists of finite numbers"),
    ("no_ends", "answered step_rewards without step_ends for its 2 queries"),
    ("outside", r"answered step_ends\[0\] = \[3\]: it must be 1 increasing token indices in the response's 3 tokens"),
    ("backwards", r"answered step_ends\[0\] = \[2, 0\]: it must be 2 increasing"),
    ("miscount", r"answered step_ends\[0\] = \[0\]: it must be 2 increasing"),
])
def test_malformed_step_answers_are_one_line_errors(prm_answers, name, message):
    base, _ = prm_answers
    with pytest.raises(RewardError, match=f"reward server {base}/{name} {message}") as e:
        RemoteRewardFn([f"{base}/{name}"], max_retries=0).with_vocab("abc")(*CALL, **IDS)
    assert "\n" not in str(e.value)


def test_the_scorer_places_a_servers_steps_or_takes_its_aggregate():
    """A reward function whose output holds step scores and ends (as RemoteRewardFn's of a PRM server): token
    rewards at the ends and a scalar 0 when the run takes them; the server's aggregate as the one reward of a
    sample when it does not (segments included); episodes cut into segments refused when stepping."""
    from rlhfkit.data.types import PromptItem, Trajectory
    from rlhfkit.models import tiny_model_and_tokenizer
    from rlhfkit.trainers.rl.scoring import Scorer

    _, tok = tiny_model_and_tokenizer(seed=0)
    seen = {}

    def served(queries, prompts, labels, **kwargs):
        seen.update(kwargs)
        return RewardOutput(torch.tensor([0.25, 0.0]), torch.tensor([0.25, 0.0]), {},
                            [torch.tensor([0.5, 0.25]), torch.tensor([])],
                            [torch.tensor([0, 2]), torch.tensor([], dtype=torch.long)])

    def traj(n, group, **info):
        t = Trajectory(torch.tensor([5, 6]), torch.arange(7, 7 + n), torch.ones(n, dtype=torch.bool), torch.zeros(n),
                       "stop", group)
        t.info.update(info)
        return t

    prompts = [PromptItem("a", [5, 6]), PromptItem("b", [5, 6])]
    scored = Scorer(served, tok, max_len=8, step_rewards=True)(prompts, [traj(3, 0), traj(4, 1)])
    assert scored.token_rewards.tolist() == [[0.5, 0.0, 0.25, 0.0], [0.0] * 4]
    assert scored.rewards.tolist() == [0.0, 0.0] and scored.scores.tolist() == [0.25, 0.0]
    assert seen["prompt_ids"] == [[5, 6], [5, 6]] and seen["completion_ids"] == [[7, 8, 9], [7, 8, 9, 10]]
    seen.clear()
    scalar = Scorer(served, tok, max_len=8)(prompts, [traj(3, 0), traj(4, 1)])
    assert scalar.token_rewards is None and scalar.rewards.tolist() == scalar.scores.tolist() == [0.25, 0.0]
    assert "prompt_ids" not in seen  # text alone: the server tokenizes it
    segments = Scorer(served, tok, max_len=8)(prompts, [traj(3, 0, episode=1), traj(3, 0, episode=1), traj(4, 1)])
    assert segments.rewards.tolist() == [0.25, 0.25, 0.0]
    with pytest.raises(RewardError, match="for episodes cut into segments"):
        Scorer(served, tok, max_len=8, step_rewards=True)(
            prompts, [traj(3, 0, episode=1), traj(3, 0, episode=1), traj(4, 1)])  # two episodes: two rows scored
