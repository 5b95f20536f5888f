"""Pure parts of the Ray engine pool: how prompts are cut into worker shards."""

import pytest

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
