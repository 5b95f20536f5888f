"""Test-wide settings: tiny models gain nothing from several threads, and on a busy 2-core machine
torch's spinning threads slow each other down many times over; one thread keeps tests steady.
Tests never reach a model hub: HF_HUB_OFFLINE=1 for the whole session (set before huggingface_hub
reads it at import), and hub names are served from caches the tests lay out (`hub_repo`)."""

import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip (not fail) without CUDA, even when asked for with `-m gpu`."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def hub_repo():
    """`hub_repo(hub_dir, kind, "org/name", folder) -> snapshot folder`: lays out the files of `folder`
    as huggingface_hub's cache holds a downloaded repo of `kind` ("model" or "dataset"):
    <hub_dir>/<kind>s--org--name/refs/main (the commit) and snapshots/<commit>/<the files>."""

    def make(hub_dir: Path, kind: str, name: str, folder: Path) -> Path:
        repo = Path(hub_dir) / f"{kind}s--{name.replace('/', '--')}"
        commit = "0123456789abcdef0123456789abcdef01234567"
        snapshot = repo / "snapshots" / commit
        shutil.copytree(folder, snapshot)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        return snapshot

    return make


@pytest.fixture
def huge_png():
    """`huge_png(path, size=20000)`: a PNG whose header says size x size pixels (a few bytes on disk,
    never decoded): an image too large to train on."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    def make(path, size: int = 20000):
        ihdr = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 7))
                         + chunk(b"IEND", b""))
        return path

    return make


@pytest.fixture(scope="session")
def json_vlm():
    """A factory of tiny random VLMs (`rlhfkit.models.tiny_vision`) whose tokenizer also holds `{}[]`
    (the character-level alphabet lacks them), so a tool call's JSON can be written: (model, processor)."""

    def make(family: str = "qwen2_vl", seed: int = 0):
        from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor

        model, processor = tiny_vision_model_and_processor(family, seed)
        processor.tokenizer.add_tokens(list("{}[]"))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model.resize_token_embeddings(len(processor.tokenizer), mean_resizing=False)
        return model, processor

    return make


@pytest.fixture(scope="session")
def sharp_vlm():
    """A factory of tiny random Qwen2-VLs whose output layer and image projector are scaled by `scale`:
    a random model's next-token distribution is nearly flat and its images move it little, so samples
    at the same seeds hardly ever tell two images apart; scaled, they do. (model, processor)."""

    def make(scale: float = 30.0, seed: int = 0):
        from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor

        model, processor = tiny_vision_model_and_processor("qwen2_vl", seed)
        with torch.no_grad():
            model.lm_head.weight.mul_(scale)
            model.model.visual.merger.mlp[2].weight.mul_(scale)
        return model, processor

    return make
