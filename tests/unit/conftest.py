"""Fixtures shared by unit tests of several packages."""

import pytest

from rlhfkit.models import tiny_model_and_tokenizer


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The tiny model (seed 0) and its tokenizer saved as an HF folder: for tests that load a model from files."""
    root = tmp_path_factory.mktemp("tiny")
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(root)
    tok.save_pretrained(root)
    return root
