"""Pure parts of the Ray engine pool: how prompts are cut into worker shards, what a worker is sent,
how a worker stages what it is sent."""

import copy
import threading

import pytest
import torch

pytest.importorskip("ray")

from rlhfkit.distributed.pool import split_even  # noqa: E402 - after ray is found


def test_split_even_by_hand():
    assert split_even(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_even(4, 2) == [(0, 2), (2, 4)]
    assert split_even(1, 3) == [(0, 1), (1, 1), (1, 1)]  # empty shards are skipped by submit
    assert split_even(0, 2) == [(0, 0), (0, 0)]


def test_policy_state_of_a_lora_policy_is_its_adapter_weights_only():
    from rlhfkit.distributed.pool import policy_state
    from rlhfkit.models.lora import add_lora
    from rlhfkit.models.tiny import tiny_model_and_tokenizer

    plain = tiny_model_and_tokenizer(seed=0)[0]
    assert policy_state(plain).keys() == plain.state_dict().keys()
    peft = add_lora(tiny_model_and_tokenizer(seed=0)[0], 4, 8, ("q_proj", "v_proj"))
    state = policy_state(peft)
    assert state and all("lora_" in k for k in state)
    assert {k for k in peft.state_dict() if "lora_" in k} == state.keys()


def test_a_vllm_worker_is_sent_the_merged_weights_in_full_then_the_adapted_modules():
    from rlhfkit.distributed.pool import engine_state
    from rlhfkit.models.lora import add_lora
    from rlhfkit.models.tiny import tiny_model_and_tokenizer

    plain = tiny_model_and_tokenizer(seed=0)[0]
    assert engine_state(plain, True).keys() == engine_state(plain, False).keys() == plain.state_dict().keys()
    peft = add_lora(tiny_model_and_tokenizer(seed=0)[0], 4, 8, ("q_proj", "v_proj"))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.fill_(0.5)
    full, update = engine_state(peft, True), engine_state(peft, False)
    assert full.keys() == plain.state_dict().keys()  # the base model's names, no adapter tensors
    assert set(update) == {f"model.layers.{i}.self_attn.{m}_proj.weight" for i in range(2) for m in "qkvo"}
    merged = copy.deepcopy(peft).merge_and_unload().state_dict()
    assert all(torch.equal(full[k], merged[k]) for k in full)


def test_a_state_staged_over_one_not_yet_loaded_is_merged_over_it():
    """A worker that was sent a full state, then an update of some layers before it generated, loads both."""
    from rlhfkit.distributed.worker import RolloutWorker

    worker = RolloutWorker.__new__(RolloutWorker)  # the staging alone, no engine
    worker.delay_s, worker._staged_cv, worker._staged = 0.0, threading.Condition(), None
    a, b, b2 = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    worker.update_weights({"a": a, "b": b}, 0)
    worker.update_weights({"b": b2}, 1)
    worker.update_weights({"a": b}, 0)  # an older version arriving late changes nothing
    assert worker._staged == ({"a": a, "b": b2}, 1)
