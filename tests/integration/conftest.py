"""Shared set-up of the integration tests: a folder with the tiny model saved as `tiny/`."""

import json

import pytest

from rlhfkit.models import tiny_model_and_tokenizer


@pytest.fixture(scope="module")
def tiny_ws(tmp_path_factory):
    """`tiny_ws(name, rows=None)`: a fresh folder with the tiny model + tokenizer in `tiny/` and, when
    `rows` are given, those records in `prompts.jsonl`."""

    def make(name, rows=None):
        root = tmp_path_factory.mktemp(name)
        model, tok = tiny_model_and_tokenizer(seed=0)
        model.save_pretrained(root / "tiny")
        tok.save_pretrained(root / "tiny")
        if rows is not None:
            (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return root

    return make
