"""Process reward models (trainers/supervised/prm.py, rewards/reward_model.py): the loss, the step layout of an RL
response and the token rewards at the step ends, with values worked out by hand."""

import math

import pytest
import torch

from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.reward import mark_prm, prm_settings, step_logits
from rlhfkit.rewards.reward_model import ProcessRewardFn, prm_layout
from rlhfkit.trainers.supervised.prm import prm_loss

LN3 = math.log(3.0)


def test_prm_loss_is_cross_entropy_over_the_two_reward_tokens():
    # P(good) = softmax([ln 3, 0])[0] = 3/4 at both steps; targets 1 and 0.25
    logits = torch.tensor([[LN3, 0.0], [LN3, 0.0]])
    loss, m = prm_loss(logits, torch.tensor([1.0, 0.25]), num_steps=2)
    first = -math.log(0.75)
    second = -(0.25 * math.log(0.75) + 0.75 * math.log(0.25))
    assert float(loss) == pytest.approx((first + second) / 2, rel=1e-6)
    assert float(m["accuracy"]) == pytest.approx(0.5)  # right on step 1, wrong on step 2
    # divided by the whole optimizer step's step count: two halves sum to the whole
    half, _ = prm_loss(logits[:1], torch.tensor([1.0]), num_steps=2)
    assert float(half) == pytest.approx(first / 2, rel=1e-6)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_layout_puts_the_placeholder_before_each_newline_run_and_at_the_end():
    _, tok = tiny_model_and_tokenizer(seed=0)
    nl, ph = {tok.convert_tokens_to_ids("\n")}, tok.convert_tokens_to_ids("#")
    skip = {tok.eos_token_id, tok.pad_token_id}
    # "1+1=2\n2*3=7<eos>": steps end at the newline (5) and at the last non-EOS token (10)
    out, marks, ends = prm_layout(ids(tok, "1+1=2\n2*3=7") + [tok.eos_token_id], nl, skip, ph)
    assert tok.decode(out) == "1+1=2#\n2*3=7#"
    assert marks == [5, 12] and ends == [5, 10]
    # a placeholder the policy wrote ends a step where it is; newlines after a step end open none
    two = [tok.convert_tokens_to_ids("\n")] * 2  # (the tiny tokenizer reads "\n\n" as one unknown token)
    out, marks, ends = prm_layout(ids(tok, "ab#") + two + ids(tok, "cd"), nl, skip, ph)
    assert tok.decode(out) == "ab#\n\ncd#" and marks == [2, 7] and ends == [2, 6]
    out, marks, ends = prm_layout(ids(tok, "\nab") + two, nl, skip, ph)
    assert tok.decode(out) == "\nab#\n\n" and marks == [3] and ends == [4]
    assert prm_layout([tok.eos_token_id], nl, skip, ph) == ([], [], [])


def test_layout_inserts_a_placeholder_of_several_tokens_whole():
    from rlhfkit.data.steps import placeholder_of

    _, tok = tiny_model_and_tokenizer(seed=0)
    nl, ph = {tok.convert_tokens_to_ids("\n")}, placeholder_of(tok, "#%", "placeholder")
    skip = {tok.eos_token_id, tok.pad_token_id}
    out, marks, ends = prm_layout(ids(tok, "1+1=2\n2*3=7") + [tok.eos_token_id], nl, skip, ph)
    assert tok.decode(out) == "1+1=2#%\n2*3=7#%"
    assert marks == [6, 14] and ends == [5, 10]  # the mark is the placeholder's last token
    two = [tok.convert_tokens_to_ids("\n")] * 2
    # "#%" the policy wrote ends a step at its "%"; a lone "#" does not
    out, marks, ends = prm_layout(ids(tok, "ab#%") + two + ids(tok, "c#d"), nl, skip, ph)
    assert tok.decode(out) == "ab#%\n\nc#d#%" and marks == [3, 10] and ends == [3, 8]


@pytest.fixture(scope="module")
def prm_folder(tmp_path_factory):
    model, tok = tiny_model_and_tokenizer(seed=0)
    mark_prm(model, "#", ("+", "-"))
    path = tmp_path_factory.mktemp("prm") / "prm"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_token_rewards_land_on_the_step_ends(prm_folder):
    assert prm_settings(prm_folder) == {"placeholder_token": "#", "reward_tokens": ["+", "-"]}
    fn = ProcessRewardFn(prm_folder, micro_batch_size=1)
    tok = fn.tokenizer
    prompts = [ids(tok, "q:"), ids(tok, "p:")]
    responses = [ids(tok, "1+1=2\n2*3=7") + [tok.eos_token_id], ids(tok, "ok")]
    token, probs = fn.step_rewards(prompts, responses)
    assert token.shape == (2, 12)
    assert token[0].nonzero().flatten().tolist() == [5, 10] and token[1].nonzero().flatten().tolist() == [1]
    # each value is the PRM's P(+) at the placeholder of "q:1+1=2#\n2*3=7#"
    row = torch.tensor([ids(tok, "q:1+1=2#\n2*3=7#")])
    mask = row == tok.convert_tokens_to_ids("#")
    with torch.no_grad():
        z = step_logits(fn.model, row, torch.ones_like(row), mask, fn.reward_ids)
    torch.testing.assert_close(token[0, [5, 10]], torch.softmax(z, -1)[:, 0])
    torch.testing.assert_close(probs[0], token[0, [5, 10]])


def test_scorer_hands_token_rewards_and_a_zero_scalar_or_the_weakest_step(prm_folder):
    from rlhfkit.data.types import PromptItem, Trajectory
    from rlhfkit.trainers.rl.scoring import Scorer

    fn = ProcessRewardFn(prm_folder)
    tok = fn.tokenizer
    resp = torch.tensor(ids(tok, "a\nb"))
    traj = Trajectory(torch.tensor(ids(tok, "q:")), resp, torch.ones(3, dtype=torch.bool), torch.zeros(3), "stop", 0)
    scored = Scorer(fn, tok, max_len=8, step_rewards=True)([PromptItem("q:", ids(tok, "q:"))], [traj])
    assert scored.rewards.tolist() == [0.0]
    assert scored.token_rewards.shape == (1, 3) and scored.token_rewards[0].nonzero().flatten().tolist() == [1, 2]
    weakest = float(scored.token_rewards[0, [1, 2]].min())
    assert scored.scores[0] == pytest.approx(weakest)
    assert scored.metrics["reward_extra/prm_steps"] == 2.0
    # a run that takes one reward per sample (a group baseline, rejection sampling): the weakest step's
    one = Scorer(fn, tok, max_len=8)([PromptItem("q:", ids(tok, "q:"))], [traj])
    assert one.token_rewards is None and one.rewards.tolist() == one.scores.tolist() == [pytest.approx(weakest)]


def test_text_contract_scores_the_weakest_step(prm_folder):
    fn = ProcessRewardFn(prm_folder)
    tok = fn.tokenizer
    out = fn(["q:a\nb"], ["q:"], [None], responses=["a\nb"])
    _, probs = fn.step_rewards([ids(tok, "q:")], [ids(tok, "a\nb")])
    assert out.rewards.tolist() == out.scores.tolist() == [pytest.approx(float(probs[0].min()))]
    assert out.extra_logs["prm_steps"].tolist() == [2.0]


def test_a_prm_needs_the_policy_vocabulary(prm_folder):
    from rlhfkit.api.builder import load_reward
    from rlhfkit.config.rl import RewardConfig
    from rlhfkit.errors import ConfigError

    fn = ProcessRewardFn(prm_folder)
    other = fn.tokenizer.__class__.from_pretrained(prm_folder)
    other.add_tokens(["<extra>"])
    with pytest.raises(ConfigError, match="vocabulary differs"):
        fn.check_vocabulary(other)
    assert isinstance(load_reward(RewardConfig(model_name_or_path=str(prm_folder))), ProcessRewardFn)


# ------------------------------------------------------------------ packed micro-batches (--ds.packing_samples)
def prm_loop(packing: bool, model, tok):
    from rlhfkit.config import parse_config
    from rlhfkit.config.prm import PRMConfig
    from rlhfkit.trainers.supervised.prm import PRMLoop

    cfg = parse_config(PRMConfig, ["--data.dataset", "unused", "--data.placeholder_token", "#", "--model.autocast",
                                   "none", "--ds.packing_samples", str(packing), "--train.batch_size", "4",
                                   "--train.micro_batch_size", "4"])
    return PRMLoop(PRMConfig.check(cfg), model, tok, STEP_ROWS_OF(tok))


def STEP_ROWS_OF(tok):
    """Four step-labelled samples of different lengths (1 to 3 steps, hard and soft labels)."""
    from rlhfkit.data.steps import encode_steps

    texts = [("1+1=2 #", ["+"]), ("2*3=7 # 7-1=6 #", ["-", 0.75]), ("ab #", [0.25]),
             ("4+4=8 # 8/2=4 # 4-4=1 #", ["+", "+", "-"])]
    ph = tok.convert_tokens_to_ids("#")
    return [encode_steps(tok, t, labels, ph, ("+", "-"), f"row {i}") for i, (t, labels) in enumerate(texts)]


def test_packed_loss_and_gradients_equal_padded():
    """--ds.packing_samples lays a micro-batch out as one row (no padding) and leaves the loss and every
    gradient as the padded rows give them (the step ends' labels carried into the packed layout)."""
    model, tok = tiny_model_and_tokenizer(seed=1)
    widths, results = {}, {}
    hook = model.model.register_forward_pre_hook(
        lambda m, a, kw: widths.setdefault(packing, []).append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    for packing in (False, True):
        loop = prm_loop(packing, model, tok)
        samples = loop.loop.items
        model.zero_grad()
        loss, metrics = loop.micro_loss(samples, samples)
        loss.backward()
        results[packing] = (float(loss.detach()), metrics["accuracy"],
                            {k: p.grad.clone() for k, p in model.named_parameters()})
    hook.remove()
    lengths = [s.input_ids.numel() for s in samples]
    # the last forward of each (split_backbone's one-time probes come first)
    assert widths[False][-1] == (4, max(lengths)) and widths[True][-1] == (1, sum(lengths))
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-5)
    assert results[True][1] == results[False][1]
    for k, g in results[False][2].items():
        torch.testing.assert_close(results[True][2][k], g, rtol=1e-4, atol=1e-6, msg=k)


def test_packed_steps_keep_each_samples_labels_at_its_step_ends():
    from rlhfkit.data.steps import collate_steps, pack_steps

    _, tok = tiny_model_and_tokenizer(seed=0)
    samples = STEP_ROWS_OF(tok)
    packed, padded = pack_steps(samples), collate_steps(samples, tok.pad_token_id)
    lengths = [s.input_ids.numel() for s in samples]
    assert packed.attention_mask is None and packed.input_ids.shape == (1, sum(lengths))
    assert packed.position_ids[0].tolist() == [t for n in lengths for t in range(n)]
    assert packed.targets[packed.step_mask].tolist() == padded.targets[padded.step_mask].tolist() == \
        [1.0, 0.0, 0.75, 0.25, 1.0, 1.0, 0.0]
    back = packed.padded(tok.pad_token_id)
    for name in ("input_ids", "attention_mask", "step_mask", "targets"):
        assert torch.equal(getattr(back, name), getattr(padded, name)), name
