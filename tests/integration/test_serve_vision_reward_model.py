"""`rlhfkit serve-reward` of a reward model over images: requests carry each sample's prompt messages,
response and images (data: URLs); the served answers are the in-process VisionRewardModelFn's, both from
a raw request and from `train rl`'s client (RemoteRewardFn), which sends the images when a prompt has any;
a train rl step of a vision-language policy against the server gets the in-process run's rewards."""

import json

import httpx
import pytest
import torch

from rlhfkit.cli.main import main
from rlhfkit.cli.serve_reward import build_app
from rlhfkit.config.serve import ServeRewardConfig
from rlhfkit.data.images import image_data_url
from rlhfkit.rewards.remote import RemoteRewardFn
from rlhfkit.rewards.reward_model import VisionRewardModelFn
from tests.integration.conftest import colour_workspace, vision_rl_flags
from tests.unit.rewards.test_remote_reward import Server
from tests.unit.rewards.test_vision_reward_fn import (
    BLUE,
    MESSAGES,
    QUESTION,
    RED,
    save_tiny_vision_rm,
)


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    return save_tiny_vision_rm(tmp_path_factory.mktemp("served_vrm") / "rm")


@pytest.fixture(scope="module")
def server(rm):
    app, what = build_app(ServeRewardConfig.from_args(["--reward.model_name_or_path", str(rm), "--device", "cpu",
                                                       "--reward.normalize_enable", "--batch_size", "2"]))
    assert what.startswith("reward model over images")
    s = Server(app)
    yield s
    s.stop()


def test_the_rl_clients_requests_are_scored_as_in_process(rm, server):
    raw = [MESSAGES, QUESTION, MESSAGES, [{"role": "user", "content": "no image here"}]]
    responses = ["red", "blue", "red", "none"]
    images = [[RED], [BLUE], [BLUE], None]
    kwargs = {"raw_prompts": raw, "responses": responses, "prompt_images": images}
    n = len(raw)
    local = VisionRewardModelFn(rm, micro_batch_size=3)(["q"] * n, ["p"] * n, [None] * n, **kwargs)
    served = RemoteRewardFn([server.url], batch_size=3, max_retries=0)(["q"] * n, ["p"] * n, [None] * n, **kwargs)
    torch.testing.assert_close(served.rewards, local.rewards, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(served.extra_logs["rm_score"], local.extra_logs["rm_score"], rtol=1e-5, atol=1e-5)
    assert abs(float(local.rewards[0] - local.rewards[2])) > 1e-4  # the same sample with another image


def post(server, **fields):
    body = {"query": ["q"], "prompts": ["p"], "labels": [None], "raw_prompts": [MESSAGES], "responses": ["red"],
            "images": [[image_data_url(RED)]], **fields}
    return httpx.post(server.url, json=body, timeout=60)


@pytest.mark.parametrize("fields, needle", [
    ({"images": [["/etc/hostname"]]}, "give a data:image/<format>;base64,<data> URL"),
    ({"images": [["http://example.com/a.png"]]}, "give a data:image/<format>;base64,<data> URL"),
    ({"images": [["data:image/png;base64,!!!"]]}, "not valid base64"),
    ({"raw_prompts": None}, "needs 1 raw_prompts"),
    ({"responses": ["a", "b"]}, "needs 1 raw_prompts"),
    ({"images": [[1]]}, "must be a list of data:image"),
])
def test_bad_image_requests_get_422(server, fields, needle):
    resp = post(server, **fields)
    assert resp.status_code == 422 and needle in resp.json()["detail"], resp.text


def test_a_raw_request_with_data_urls_is_scored(rm, server):
    resp = post(server)
    assert resp.status_code == 200, resp.text
    local = VisionRewardModelFn(rm)(["q"], ["p"], [None], raw_prompts=[MESSAGES], responses=["red"],
                                    prompt_images=[[RED]])
    assert resp.json()["rewards"] == pytest.approx(local.rewards.tolist(), rel=1e-5, abs=1e-5)


def test_an_rl_step_of_a_vlm_against_the_server_is_the_in_process_step(rm, server, tmp_path):
    ws = colour_workspace(tmp_path / "ws")
    steps = {}
    for name, reward in (("local", {"reward.model_name_or_path": rm}), ("remote", {"reward.remote_url": server.url})):
        out = tmp_path / name
        flags = vision_rl_flags(ws, out, **{"reward.remote_url": None, "train.max_steps": 1, **reward})
        assert main(["train", "rl", *flags]) == 0
        steps[name] = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    a, b = steps["local"], steps["remote"]
    assert a["reward"] == pytest.approx(b["reward"], rel=1e-5, abs=1e-5)
    assert a["reward_extra/rm_score"] == pytest.approx(b["reward_extra/rm_score"], rel=1e-5, abs=1e-5)
