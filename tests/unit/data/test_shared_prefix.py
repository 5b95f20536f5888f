"""The shared-prefix layout and the micro-batch planner: layouts worked out by hand, and the
forward on it equal to the padded forward (logprobs, values and every gradient)."""

import pytest
import torch

from rlhfkit.data.batch import collate, select_rows
from rlhfkit.data.packing import micro_batches, pack_shared_prefix, shared_prefix_rows
from rlhfkit.data.types import Trajectory
from rlhfkit.models import Critic, response_logprobs, tiny_model_and_tokenizer


def traj(prompt, response, group_id=0):
    r = torch.tensor(response, dtype=torch.long)
    return Trajectory(prompt_ids=torch.tensor(prompt, dtype=torch.long), response_ids=r,
                      loss_mask=torch.ones(len(r), dtype=torch.bool), logprobs=torch.zeros(len(r)),
                      finish_reason="stop", version=0, group_id=group_id)


def test_rows_group_equal_prompts_in_first_appearance_order_and_respect_the_row_size():
    keys = ["a", "b", "a", "a", "b"]
    # a: prompt 3; responses 2, 2, 2 -> rows of <= 7 tokens hold a + two responses
    assert shared_prefix_rows([3, 4, 3, 3, 4], [2, 1, 2, 2, 1], keys, 7) == [[0, 2], [1, 4], [3]]
    assert shared_prefix_rows([3, 4, 3, 3, 4], [2, 1, 2, 2, 1], keys, 100) == [[0, 2, 3], [1, 4]]
    assert shared_prefix_rows([9], [9], ["x"], 4) == [[0]]  # one sample per row at least


def test_layout_by_hand():
    b = collate([traj([5, 6], [7, 8]), traj([9], [3]), traj([5, 6], [4])], pad_id=0)
    sp = pack_shared_prefix(b, torch.tensor([0, 1, 2]), pad_id=0, max_row_tokens=100)
    assert sp.input_ids.tolist() == [[5, 6, 7, 8, 4], [9, 3, 0, 0, 0]]
    assert sp.position_ids.tolist() == [[0, 1, 2, 3, 2], [0, 1, 0, 0, 0]]
    m = sp.attention_mask[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0],
                 [1, 1, 1, 0, 0],
                 [1, 1, 1, 1, 0],
                 [1, 1, 0, 0, 1]]  # the second response sees the prompt and itself, not the first response
    assert sp.attention_mask[1, 0].int().tolist()[2:] == [[0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
    # sample 0: token 7 predicted at flat 1 (prompt end), token 8 at flat 2; sample 1 at 5 (row 1, pos 0);
    # sample 2: token 4 at flat 1; padding entries repeat the last valid index
    assert sp.flat_index.tolist() == [[1, 2], [5, 5], [1, 1]]
    assert sp.num_tokens == 7 and sp.batch_size == 3
    ref = select_rows(b, torch.tensor([0, 1, 2]))
    assert torch.equal(sp.response_ids, ref.response_ids) and torch.equal(sp.loss_mask, ref.loss_mask)


def random_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for gid in range(3):
        p = torch.randint(5, 60, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        for _ in range(4):
            n = int(torch.randint(1, 7, (1,), generator=g))
            trajs.append(traj(p, torch.randint(5, 60, (n,), generator=g).tolist(), gid))
    return collate(trajs, pad_id=0), torch.randperm(len(trajs), generator=g)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("row_tokens", [12, 512])
def test_forward_and_gradients_equal_the_padded_layout(attn, row_tokens):
    torch.manual_seed(0)
    model, _ = tiny_model_and_tokenizer()
    model.config._attn_implementation = attn
    batch, rows = random_batch(1)

    def run(mb):
        model.zero_grad()
        logp, ent = response_logprobs(model, mb, temperature=0.7, with_entropy=True)
        m = mb.loss_mask
        ((logp * m).sum() + (ent * m).sum()).backward()
        return logp[m], [p.grad.clone() for p in model.parameters()]

    lp_pad, g_pad = run(select_rows(batch, rows))
    sp = pack_shared_prefix(batch, rows, 0, row_tokens)
    lp_sp, g_sp = run(sp)
    assert sp.num_tokens < select_rows(batch, rows).num_tokens  # prompts computed once per row
    torch.testing.assert_close(lp_sp, lp_pad, atol=1e-5, rtol=1e-5)
    for a, b in zip(g_sp, g_pad, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_critic_values_equal_the_padded_layout():
    torch.manual_seed(0)
    model, _ = tiny_model_and_tokenizer()
    critic = Critic.from_causal_lm(model)
    batch, rows = random_batch(2)
    pad = select_rows(batch, rows)
    sp = pack_shared_prefix(batch, rows, 0, 512)
    torch.testing.assert_close(critic.response_values(sp)[sp.response_mask],
                               critic.response_values(pad)[pad.response_mask], atol=1e-5, rtol=1e-5)


def test_micro_batches_by_count_and_by_tokens():
    p, r, keys = [4, 4, 4, 2, 2], [3, 3, 3, 1, 9], [0, 0, 0, 1, 1]
    assert micro_batches(range(5), p, r, keys, max_samples=2) == [[0, 1], [2, 3], [4]]
    # token budget 10: sample 0 costs 7, sample 1 another 7 (no sharing) -> cut
    assert micro_batches(range(5), p, r, keys, max_tokens=10) == [[0], [1], [2, 3], [4]]
    # sharing: samples 1 and 2 cost 3 each after sample 0 (7 + 3 = 10), sample 3 costs 3 -> cut
    assert micro_batches(range(5), p, r, keys, max_tokens=10, shared_prefix_row_tokens=100) == [[0, 1], [2, 3], [4]]
    assert micro_batches(range(5), p, r, keys, max_tokens=13, shared_prefix_row_tokens=100) == [[0, 1, 2], [3, 4]]
    # a row of at most 8 tokens holds prompt + one response of 3: no sharing past it
    assert micro_batches(range(3), p, r, keys, max_tokens=13, shared_prefix_row_tokens=8) == [[0], [1], [2]]
    assert micro_batches([2, 0], p, r, keys, max_samples=8) == [[2, 0]]  # keeps the given order
