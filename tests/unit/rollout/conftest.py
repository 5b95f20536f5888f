"""Shared set-up of the engine tests: the tiny model (one per test module) and three prompts tokenized by it."""

import pytest

from rlhfkit.models import tiny_model_and_tokenizer

TEXTS = ["What is 2+3?", "1+1=", "Hello there, how are you?"]
# Greedy continuations of TEXTS under tiny_model_and_tokenizer(seed=0) contain token 13 at
# steps 3, 0 and never: a stop id that finishes rows at different steps.
STOP = 13


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer(seed=0)


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tok = tiny
    return [tok(t)["input_ids"] for t in TEXTS]
