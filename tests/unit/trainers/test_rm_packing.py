"""`train rm --ds.packing_samples`: a micro-batch of pairs runs as one packed row (position ids restarting at 0
for each sample, no mask) and each sample's score is read where the padded forward reads it, so the scores,
the loss and every gradient equal the padded batch's; a backbone that cannot keep packed samples apart
(Mamba's recurrence) runs as padded rows."""

import pytest
import torch
import transformers

from rlhfkit.data.batch import collate
from rlhfkit.data.packing import pack
from rlhfkit.data.supervised import PairSample, TokenSample
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.backbone_reward import BackboneRewardModel
from rlhfkit.models.critic import critic_backbone
from rlhfkit.models.lora import add_lora
from rlhfkit.models.reward import batch_scores, init_reward_model, packable_layout
from rlhfkit.models.tiny import tiny_tokenizer


def sample(prompt: list[int], response: list[int]) -> TokenSample:
    return TokenSample(torch.tensor(prompt), torch.tensor(response), torch.ones(len(response), dtype=torch.bool))


# The last response ends in the pad token (id 0): a *ForSequenceClassification reads the token before it.
SAMPLES = [sample([5, 6, 7], [8, 9]), sample([10], [11, 12, 13, 14, 15]), sample([16, 17], [18, 2]),
           sample([19, 20, 21, 22], [23, 0])]


def seq_cls(arch: str, tmp_path) -> torch.nn.Module:
    model, tok = tiny_model_and_tokenizer(seed=1, arch=arch)
    model.save_pretrained(tmp_path / arch)
    return init_reward_model(tmp_path / arch, tok.pad_token_id, seed=2).eval()


def backbone_rm(config) -> BackboneRewardModel:
    torch.manual_seed(1)
    rm = BackboneRewardModel(critic_backbone(transformers.AutoModelForCausalLM.from_config(config)))
    torch.nn.init.normal_(rm.score.weight)
    return rm.eval()


def cohere2():
    return transformers.Cohere2Config(vocab_size=len(tiny_tokenizer()), hidden_size=64, num_hidden_layers=2,
                                      intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                      pad_token_id=0, sliding_window=64)


def mamba():
    return transformers.MambaConfig(vocab_size=len(tiny_tokenizer()), hidden_size=64, num_hidden_layers=2,
                                    state_size=8, pad_token_id=0)


def widths_of(backbone: torch.nn.Module, run) -> tuple[list[tuple], object]:
    """(the input_ids shapes of `backbone`'s forwards while `run()` runs, what it returns)."""
    seen = []

    def note(module, args, kwargs):  # transformers' classifiers pass the ids positionally
        seen.append(tuple(kwargs.get("input_ids", args[0] if args else None).shape))

    hook = backbone.register_forward_pre_hook(note, with_kwargs=True)
    try:
        out = run()
    finally:
        hook.remove()
    return seen, out


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen3"])
def test_packed_scores_of_a_classifier_equal_the_padded_ones(arch, tmp_path):
    rm = seq_cls(arch, tmp_path)
    backbone = getattr(rm, rm.base_model_prefix)
    with torch.no_grad():
        padded = batch_scores(rm, collate(SAMPLES, 0))
        widths, packed = widths_of(backbone, lambda: batch_scores(rm, pack(SAMPLES, 0)))
    assert widths == [(1, 21)]  # one packed row of 5 + 6 + 4 + 6 tokens
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_packed_scores_of_a_backbone_reward_model_read_the_last_token():
    rm = backbone_rm(cohere2())
    with torch.no_grad():
        padded = batch_scores(rm, collate(SAMPLES, 0))
        widths, packed = widths_of(rm.model, lambda: batch_scores(rm, pack(SAMPLES, 0)))
    assert widths == [(1, 21)]
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_a_recurrent_backbone_runs_packed_samples_as_padded_rows():
    rm = backbone_rm(mamba())
    assert getattr(packable_layout(rm, pack(SAMPLES, 0)), "position_ids", None) is None  # a padded TokenBatch
    with torch.no_grad():
        widths, packed = widths_of(rm.model, lambda: batch_scores(rm, pack(SAMPLES, 0)))
        assert widths == [(4, 6)]
        torch.testing.assert_close(packed, batch_scores(rm, collate(SAMPLES, 0)))


def test_lora_packed_scores_use_the_trained_head_copy(tmp_path):
    rm = add_lora(seq_cls("llama", tmp_path), 2, 4, ("q_proj", "v_proj"), task_type="SEQ_CLS")
    with torch.no_grad():
        for name, p in rm.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(0.1)  # adapters and the trained head away from their start
        torch.testing.assert_close(batch_scores(rm, pack(SAMPLES, 0)), batch_scores(rm, collate(SAMPLES, 0)),
                                   rtol=1e-5, atol=1e-5)


def rm_loop(packing: bool, model, tok):
    from rlhfkit.config import parse_config
    from rlhfkit.config.preference import RMConfig, validate_rm
    from rlhfkit.trainers.supervised.preference import RMLoop

    cfg = parse_config(RMConfig, ["--data.dataset", "unused", "--model.autocast", "none", "--ds.packing_samples",
                                  str(packing), "--train.batch_size", "2", "--train.micro_batch_size", "2"])
    pairs = [PairSample(SAMPLES[0], SAMPLES[2]), PairSample(SAMPLES[1], SAMPLES[3], index=1)]
    return RMLoop(validate_rm(cfg), model, tok, pairs)


def test_packed_loss_and_gradients_equal_padded(tmp_path):
    """--ds.packing_samples lays a micro-batch of pairs out as one row and leaves the loss, the scores and
    every gradient as the padded rows give them."""
    rm, tok = seq_cls("llama", tmp_path).train(), tiny_tokenizer()
    results, widths = {}, {}
    for packing in (False, True):
        loop = rm_loop(packing, rm, tok)
        rm.zero_grad()

        def step():
            loss, metrics = loop.micro_loss(loop.loop.items, loop.loop.items)
            loss.backward()
            results[packing] = (float(loss.detach()), metrics, {k: p.grad.clone() for k, p in rm.named_parameters()})

        widths[packing] = widths_of(rm.model, step)[0]
    assert widths == {False: [(4, 6)], True: [(1, 21)]}
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-5)
    for key in ("accuracy", "chosen_reward", "rejected_reward"):
        assert results[True][1][key] == pytest.approx(results[False][1][key], rel=1e-5, abs=1e-6)
    for k, g in results[False][2].items():
        torch.testing.assert_close(results[True][2][k], g, rtol=1e-4, atol=1e-6, msg=k)


def test_a_roberta_decoder_gets_a_reward_head_on_its_last_token(tmp_path):
    """RoBERTa's sequence classifier has no `score` head and reads the first token (under a decoder's causal
    mask: the prompt's first token alone): the reward model is the score head on its decoder instead."""
    rm = seq_cls("roberta", tmp_path)
    assert isinstance(rm, BackboneRewardModel)
    other = [sample(s.prompt_ids.tolist(), [24, 25]) for s in SAMPLES]  # the same prompts, other responses
    with torch.no_grad():
        padded, packed, changed = (batch_scores(rm, b) for b in (collate(SAMPLES, 0), pack(SAMPLES, 0),
                                                                 collate(other, 0)))
        alone = torch.cat([batch_scores(rm, collate([s], 0)) for s in SAMPLES])
    torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)
    assert (changed - padded).abs().min() > 1e-4  # the scores read the responses
