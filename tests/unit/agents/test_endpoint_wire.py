"""The request fields the endpoint reads (wire.sampling), by hand: OpenAI's forms, nulls as absent."""

import pytest

from rlhfkit.agents.endpoint.wire import BadRequest, sampling


def test_max_tokens_is_read_from_either_field_and_a_null_one_is_absent():
    assert sampling({"max_tokens": 5}, chat=True).max_tokens == 5
    assert sampling({"max_completion_tokens": 7, "max_tokens": 5}, chat=True).max_tokens == 7
    assert sampling({"max_completion_tokens": None, "max_tokens": 5}, chat=True).max_tokens == 5
    assert sampling({"max_tokens": None}, chat=True).max_tokens is None


def test_stop_seed_and_stream_options_of_the_wrong_form_are_refused_naming_the_field():
    ask = sampling({"stop": "##", "seed": -3, "stream": True, "stream_options": {"include_usage": True}}, chat=True)
    assert ask.stop == ("##",) and ask.seed == -3 and ask.stream
    assert sampling({"stop": ["a", "b"], "stop_token_ids": None}, chat=False).stop == ("a", "b")
    for body, field in (({"stop": 5}, "stop"), ({"stop": [1]}, "stop"), ({"seed": 1.5}, "seed"),
                        ({"seed": "1"}, "seed"), ({"stream_options": "usage"}, "stream_options")):
        with pytest.raises(BadRequest, match=f"^{field}"):
            sampling(body, chat=True)
