"""Stop strings on text: the cut falls after the token that completes the first stop string."""

import pytest
import torch

from rlhfkit.data.types import FINISH_LENGTH, FINISH_STOP, Trajectory
from rlhfkit.models.tiny import tiny_model_and_tokenizer
from rlhfkit.rollout.stops import cut_at_stop_strings, split_stops, stop_position

TOK = tiny_model_and_tokenizer(seed=0)[1]  # characters: '0'..'9' = ids 4..13, 'a'.. = 14.., ' ' = 66


def ids(text):
    return TOK.encode(text, add_special_tokens=False)


def traj(text, finish=FINISH_LENGTH):
    r = torch.tensor(ids(text))
    return Trajectory(prompt_ids=torch.tensor([3]), response_ids=r, loss_mask=torch.ones_like(r, dtype=torch.bool),
                      logprobs=-torch.arange(1, len(r) + 1, dtype=torch.float32), finish_reason=finish, version=0,
                      versions=torch.zeros_like(r))


def test_split_stops_keeps_ids_and_adds_one_token_strings_as_ids():
    assert split_stops([7, "a", "cd"], TOK) == ((7, ids("a")[0]), ("a", "cd"))
    with pytest.raises(ValueError, match="empty string"):
        split_stops([""], TOK)
    with pytest.raises(TypeError):
        split_stops([1.5], TOK)


def test_stop_position_is_the_token_completing_the_first_stop_string():
    assert stop_position(ids("ab cd ef"), ["cd"], TOK) == 5  # 'a','b',' ','c','d'
    assert stop_position(ids("ab cd ef"), ["zz", " e"], TOK) == 7
    assert stop_position(ids("ab cd ef"), ["zz"], TOK) is None


def test_cut_keeps_the_prefix_its_logprobs_and_marks_a_stop():
    t = cut_at_stop_strings(traj("ab cd ef"), ["cd"], TOK)
    assert t.response_ids.tolist() == ids("ab cd") and t.finish_reason == FINISH_STOP
    assert t.logprobs.tolist() == [-1.0, -2.0, -3.0, -4.0, -5.0] and t.loss_mask.shape == (5,)
    assert t.versions.shape == (5,)
    untouched = traj("ab", FINISH_LENGTH)
    assert cut_at_stop_strings(untouched, ["cd"], TOK) is untouched
    # a stop string completed by the last token of a length-truncated sample turns it into a stop
    assert cut_at_stop_strings(traj("ab cd"), ["cd"], TOK).finish_reason == FINISH_STOP
