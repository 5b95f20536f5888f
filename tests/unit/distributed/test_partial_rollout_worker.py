"""A rollout worker with partial rollouts, in this process (no Ray): weights staged while a
generation is in flight are loaded between slices, the generation continues with them, and its
tokens carry both versions: the logprobs of the tokens after the load are the new weights' (over the
KV cache the old weights wrote), computed here by hand with transformers' own forward."""

from __future__ import annotations

import torch

from rlhfkit.distributed.worker import RolloutWorker
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams

PARAMS = SamplingParams(max_new_tokens=9, temperature=1.0, n=2)


def mixed_logprobs(models: dict, prompt: list[int], response: torch.Tensor, versions: torch.Tensor) -> torch.Tensor:
    """Logprobs [L] of `response` when token i was sampled from the logits of the weights of `versions[i]`
    (`models`: version -> model), each forward reading the KV cache the earlier ones wrote, as a
    generation continued across weight loads computes them (nothing decoded is recomputed)."""
    feeds = [(int(versions[0]), list(prompt))]  # the prompt's prefill gives token 0's logits
    for j in range(len(response) - 1):  # feeding token j gives token j + 1's logits
        v = int(versions[j + 1])
        if feeds[-1][0] == v:
            feeds[-1][1].append(int(response[j]))
        else:
            feeds.append((v, [int(response[j])]))
    cache, logits = None, []
    with torch.no_grad():
        for v, ids in feeds:
            out = models[v](input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits.append(out.logits[0])
    logits = torch.cat(logits)[len(prompt) - 1:].float()
    return torch.log_softmax(logits, -1).gather(-1, response.unsqueeze(-1)).squeeze(-1)


def test_weights_staged_mid_generation_are_used_for_the_rest_of_it(tmp_path):
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    worker = RolloutWorker(str(tmp_path), None, "float32", None, None, partial_tokens=3)
    worker.update_weights(model.state_dict(), 0)
    new = {k: v * 1.1 for k, v in model.state_dict().items()}
    resume, calls = worker.engine.resume, []

    def resume_then_stage(gen, budget=None):  # version 1 arrives while the first slice decodes
        calls.append(budget)
        out = resume(gen, budget)
        if len(calls) == 1:
            worker.update_weights(new, 1)
        return out

    worker.engine.resume = resume_then_stage
    prompts = [tok("What is 2+3?")["input_ids"]]
    trajs = worker.generate(prompts, PARAMS, seeds=[7])
    assert calls[0] == 3 and worker.engine.version == 1
    mixed = [t for t in trajs if t.response_length > 4]
    assert mixed, "no sample outlived the first slice"
    loaded, _ = tiny_model_and_tokenizer(seed=0)
    loaded.load_state_dict(new)
    for t in mixed:
        # 3 tokens decoded with version 0, the 4th sampled from logits computed before the load
        assert t.versions[:4].tolist() == [0] * 4 and set(t.versions[4:].tolist()) == {1} and t.version == 0
        # the weights were loaded, not only the version stamped: the new weights' logprobs from the 5th token on
        want = mixed_logprobs({0: model.eval(), 1: loaded.eval()}, prompts[0], t.response_ids, t.versions)
        stale = mixed_logprobs({0: model, 1: model}, prompts[0], t.response_ids, t.versions)
        torch.testing.assert_close(t.logprobs, want, atol=1e-4, rtol=0)
        assert (stale[4:] - want[4:]).abs().max() > 1e-2  # the two weights tell apart on these tokens
    whole = RolloutWorker(str(tmp_path), None, "float32", None, None)
    whole.update_weights(model.state_dict(), 0)
    same = whole.generate(prompts, PARAMS, seeds=[7])
    for a, b in zip(trajs, same):  # the tokens before the update are the uninterrupted generation's
        assert torch.equal(a.response_ids[:4], b.response_ids[:4])
