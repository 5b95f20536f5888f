"""The shared-prefix layout and the micro-batch planner: layouts worked out by hand, and the
forward on it equal to the padded forward (logprobs, values and every gradient)."""

import pytest
import torch

from rlhfkit.data.batch import collate, select_rows
from rlhfkit.data.packing import (
    micro_batches,
    pack_shared_prefix,
    rows_by_length,
    shared_prefix_rows,
)
from rlhfkit.data.types import Trajectory
from rlhfkit.models import Critic, response_logprobs, tiny_model_and_tokenizer
from rlhfkit.models import logprobs as logprobs_module


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


def test_rows_by_length_fill_rows_longest_first_with_prompts_shared_where_they_can():
    keys = ["a", "a", "b", "a", "b", "c"]
    p, r = [3, 3, 2, 3, 2, 1], [6, 1, 2, 2, 1, 1]
    # order by p + r (stable): 0 (9), 3 (5), 1 (4), 2 (4), 4 (3), 5 (2). Width 10: 0 opens row 0 (9);
    # 3 (a + 2) fits nowhere -> row 1 (5); 1 shares a in row 0 (10); 2 (b + 2) -> row 1 (9); 4 shares
    # b in row 1 (10); 5 (c + 1) -> row 2
    assert rows_by_length(p, r, keys, 10) == [[0, 1], [3, 2, 4], [5]]
    # width 9: 1 shares a in row 1 (6), not row 0 (10); 2 (b + 2) -> row 2 (4); 4 shares b there (5);
    # 5 (c + 1) -> row 1 (8), the first with room
    assert rows_by_length(p, r, keys, 9) == [[0], [3, 1, 5], [2, 4]]
    with pytest.raises(ValueError, match="does not fit"):
        rows_by_length([3], [9], ["a"], 10)


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


def test_two_prompts_in_one_row_by_hand():
    """A long sample of prompt a fixes the width; the short samples of a and b share the second row
    (one prompt per row: three rows). Each response sees its own prompt and itself only."""
    b = collate([traj([5, 6], [7, 8, 9, 3]), traj([5, 6], [4]), traj([2], [3, 1])], pad_id=0)
    old = pack_shared_prefix(b, torch.tensor([0, 1, 2]), pad_id=0, max_row_tokens=6, by_length=False)
    assert old.input_ids.tolist() == [[5, 6, 7, 8, 9, 3], [5, 6, 4, 0, 0, 0], [2, 3, 1, 0, 0, 0]]
    sp = pack_shared_prefix(b, torch.tensor([0, 1, 2]), pad_id=0, max_row_tokens=6)
    assert sp.input_ids.tolist() == [[5, 6, 7, 8, 9, 3], [5, 6, 4, 2, 3, 1]]
    assert sp.position_ids[1].tolist() == [0, 1, 2, 0, 1, 2]
    assert sp.attention_mask[1, 0].int().tolist() == [[1, 0, 0, 0, 0, 0],
                                                      [1, 1, 0, 0, 0, 0],
                                                      [1, 1, 1, 0, 0, 0],
                                                      [0, 0, 0, 1, 0, 0],
                                                      [0, 0, 0, 1, 1, 0],
                                                      [0, 0, 0, 1, 1, 1]]
    # sample 1's token 4 is predicted by its prompt's end (row 1, position 1); sample 2's by row 1's 3, 4
    assert sp.flat_index.tolist() == [[1, 2, 3, 4], [7, 7, 7, 7], [9, 10, 10, 10]]
    assert sp.num_tokens == 12 and old.num_tokens == 12  # the same real tokens in 2 rows instead of 3
    padded, ref = sp.padded(), select_rows(b, torch.tensor([0, 1, 2]))
    assert torch.equal(padded.input_ids * padded.attention_mask, ref.input_ids * ref.attention_mask)


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


def uneven_batch(seed: int):
    """4 prompts x 3 samples with very uneven responses (1 to 40 tokens: most rows finish early),
    two groups with the same prompt length, in a shuffled order."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for gid, p_len in enumerate([3, 7, 7, 12]):
        p = torch.randint(5, 60, (p_len,), generator=g).tolist()
        for n in [[40, 1, 2], [5, 1, 30], [1, 1, 1], [9, 17, 2]][gid]:
            trajs.append(traj(p, torch.randint(5, 60, (n,), generator=g).tolist(), gid))
    return collate(trajs, pad_id=0), torch.randperm(len(trajs), generator=g)


@pytest.mark.parametrize("attn", ["sdpa", "eager", "sdpa-wide"])
@pytest.mark.parametrize("row_tokens", [16, 24])
def test_rows_by_length_with_uneven_responses_equal_the_padded_layout(attn, row_tokens, monkeypatch):
    """Logprobs, entropies and every gradient of the by-length rows (several prompts per row), of the
    one-prompt rows and of the padded rows agree; "sdpa-wide": the 4-D mask under SDPA on CPU, as
    rows wider than EAGER_ROW_TOKENS run."""
    torch.manual_seed(0)
    model, _ = tiny_model_and_tokenizer()
    model.config._attn_implementation = "eager" if attn == "eager" else "sdpa"
    if attn == "sdpa-wide":
        monkeypatch.setattr(logprobs_module, "EAGER_ROW_TOKENS", 0)
    batch, rows = uneven_batch(3)

    def run(mb):
        model.zero_grad()
        logp, ent = response_logprobs(model, mb, temperature=0.7, with_entropy=True, entropy_grad=False)
        m = mb.loss_mask
        assert not logp[~mb.response_mask].any()  # the head ran on response tokens only
        (logp * m * torch.linspace(0.5, 1.5, m.shape[1])).sum().backward()
        return logp[m], ent[m], [p.grad.clone() for p in model.parameters()]

    pad = select_rows(batch, rows)
    want = run(pad)
    by_length = pack_shared_prefix(batch, rows, 0, row_tokens)
    one_prompt = pack_shared_prefix(batch, rows, 0, row_tokens, by_length=False)
    assert by_length.input_ids.shape[1] == one_prompt.input_ids.shape[1]  # same width, fewer rows
    assert by_length.input_ids.shape[0] < one_prompt.input_ids.shape[0]
    assert by_length.input_ids.numel() < one_prompt.input_ids.numel() < pad.input_ids.numel()
    for layout in (by_length, one_prompt):
        got = run(layout)
        torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
        for a, b in zip(got[2], want[2], strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_critic_values_of_rows_by_length_equal_the_padded_layout():
    torch.manual_seed(0)
    model, _ = tiny_model_and_tokenizer()
    critic = Critic.from_causal_lm(model)
    torch.nn.init.normal_(critic.value_head.weight, generator=torch.Generator().manual_seed(0))
    batch, rows = uneven_batch(4)
    pad = select_rows(batch, rows)
    sp = pack_shared_prefix(batch, rows, 0, 16)
    assert sp.input_ids.shape[0] < pack_shared_prefix(batch, rows, 0, 16, by_length=False).input_ids.shape[0]
    values = critic.response_values(sp)
    (values * sp.response_mask).sum().div(sp.response_mask.sum()).backward()  # a token mean
    grads = [p.grad.clone() for p in critic.parameters()]
    critic.zero_grad()
    want = critic.response_values(pad)
    (want * pad.response_mask).sum().div(pad.response_mask.sum()).backward()
    torch.testing.assert_close(values[sp.response_mask], want[pad.response_mask], atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, [p.grad for p in critic.parameters()], strict=True):
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
