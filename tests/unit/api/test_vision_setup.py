"""api/vision.py: the frozen tower shared by the reference (and frozen in the critic; under FSDP the
reference keeps its own), the executors refused with images, and the vLLM engine checked before models load."""

import copy

import pytest

from rlhfkit.agents import AgentInstanceBase, MultiTurnExecutor, SingleTurnExecutor
from rlhfkit.agents.execute import AgentExecutorBase, ExecuteRunner
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.api.vision import (
    attach_processor,
    check_engine,
    check_executor,
    prepare_policy,
    processor_of,
)
from rlhfkit.config import RLConfig
from rlhfkit.errors import ConfigError
from rlhfkit.models.critic import Critic
from rlhfkit.models.tiny_vision import save_tiny_vision, tiny_vision_model_and_processor
from rlhfkit.models.vision import vision_parts


def config(*flags):
    return RLConfig.from_args(["--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2",
                               "--train.batch_size", "4", "--train.micro_batch_size", "2", *flags])


@pytest.mark.parametrize("freeze", [True, False])
def test_the_reference_shares_the_frozen_tower(freeze):
    policy, _ = tiny_vision_model_and_processor("llava")
    ref, critic = copy.deepcopy(policy), Critic.from_causal_lm(policy)
    prepare_policy(config(*(["--actor.freeze_visual_encoder"] if freeze else [])), policy, ref, critic)
    (_, tower), (_, ref_tower) = vision_parts(policy)[0], vision_parts(ref)[0]
    assert (ref_tower is tower) == freeze
    assert all(not p.requires_grad for p in tower.parameters()) == freeze
    critic_tower = critic.backbone.vision_tower  # the critic's own copy, frozen with the policy's
    assert critic_tower is not tower and all(not p.requires_grad for p in critic_tower.parameters()) == freeze
    assert any(p.requires_grad for p in policy.model.language_model.parameters())


def test_under_fsdp_the_reference_keeps_its_own_frozen_tower():
    """Each model is sharded on its own: a module shared by two would be sharded twice."""
    policy, _ = tiny_vision_model_and_processor("llava", seed=0)
    ref = copy.deepcopy(policy)
    prepare_policy(config("--actor.freeze_visual_encoder", "--fsdp.enable", "true"), policy, ref)
    (_, tower), (_, ref_tower) = vision_parts(policy)[0], vision_parts(ref)[0]
    assert ref_tower is not tower and not any(p.requires_grad for p in tower.parameters())


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def test_agent_files_tools_and_functions_run_with_images_but_other_executors_are_refused():
    cfg = config()
    check_executor(cfg, MultiTurnExecutor(AgentInstanceBase))
    check_executor(cfg, SingleTurnExecutor())
    check_executor(cfg, ToolExecutor([add]))
    pytest.importorskip("fastapi")
    from rlhfkit.agents.endpoint import EndpointExecutor

    async def agent(client, prompt, label, **row):
        return 1.0

    check_executor(cfg, EndpointExecutor(agent))  # the OpenAI-compatible endpoint's image_url parts
    check_executor(cfg, ExecuteRunner(AgentExecutorBase, "agent.py", instance=AgentExecutorBase()))  # OpenRLHF 2026
    with pytest.raises(ConfigError, match="mid-2025 contract .* takes no images"):
        check_executor(cfg, ExecuteRunner(AgentExecutorBase, "agent.py"))  # execute(prompt, label, sampling_params)

    class Other:
        provides_rewards = True

    with pytest.raises(ConfigError, match="does not run with Other yet"):
        check_executor(cfg, Other())


@pytest.mark.parametrize("family,name", [("paligemma", "PaliGemma"), ("mllama", "Llama 3.2 Vision")])
def test_single_turn_families_refuse_agent_episodes_in_one_line(tmp_path, family, name):
    """A later call's context: PaliGemma's rollout would prefill it all as the prefix where the trainer types the
    earlier response as the suffix; Llama 3.2 Vision's per-token cross-attention masks of two calls do not
    merge (the trainer's forward fails on a shape)."""
    folder = save_tiny_vision(tmp_path / family, family)
    cfg = config("--actor.model_name_or_path", str(folder))
    check_executor(cfg, SingleTurnExecutor())
    with pytest.raises(ConfigError, match=f"a {name} policy .* does not run agent episodes yet") as err:
        check_executor(cfg, ToolExecutor([add]))
    assert "\n" not in str(err.value)
    hub = config("--actor.model_name_or_path", f"google/{family}-hub-name")  # its download: the resolved folder
    with pytest.raises(ConfigError, match=f"a {name} policy .* does not run agent episodes yet"):
        check_executor(hub, ToolExecutor([add]), str(folder))
    check_executor(config("--actor.model_name_or_path", str(save_tiny_vision(tmp_path / "q", "qwen2_vl"))),
                   ToolExecutor([add]))


def test_the_processor_reaches_the_multi_turn_and_the_tool_executors():
    _, processor = tiny_vision_model_and_processor("llava")
    agent, tools = MultiTurnExecutor(AgentInstanceBase), ToolExecutor([add])
    attach_processor(processor, 3, agent, tools, None)
    assert agent.processor is processor and agent.max_images == 3 and tools.processor is processor


def test_sft_rm_dpo_and_kto_train_a_vlm_and_the_other_supervised_kinds_are_refused(tmp_path):
    from types import SimpleNamespace

    from rlhfkit.api.vision import supervised_folder
    from rlhfkit.models.tiny_vision import save_tiny_vision

    folder = str(save_tiny_vision(tmp_path / "vlm", "llava"))
    cfg = SimpleNamespace(model=SimpleNamespace(model_name_or_path=folder))
    assert [supervised_folder(kind, cfg) for kind in ("sft", "rm", "dpo", "kto")] == [folder] * 4
    for kind in ("prm", "kd"):
        with pytest.raises(ConfigError, match=f"train {kind} does not train a vision-language model .* train kto do"):
            supervised_folder(kind, cfg)


def test_the_vllm_engine_is_checked_before_models_load_in_the_trainers_process_and_on_ray_workers(tmp_path):
    """The families whose image tokens become vLLM's placeholders pass, in the trainer's process and on Ray
    rollout workers alike; the others are refused in one line, from the folder alone; HF engines are not checked."""
    from rlhfkit.models.tiny_vision import save_tiny_vision

    qwen, internvl = (str(save_tiny_vision(tmp_path / f, f)) for f in ("qwen2_vl", "internvl"))
    processors = {f: processor_of(f) for f in (qwen, internvl)}
    ray = ("--distributed.backend", "ray", "--rollout.num_workers", "2")
    for flags in (("--rollout.engine", "vllm"), ("--rollout.engine", "vllm", *ray)):
        check_engine(config(*flags), qwen, processors[qwen])
        with pytest.raises(ConfigError, match="--rollout.engine vllm does not send the images of") as e:
            check_engine(config(*flags), internvl, processors[internvl])
        assert "\n" not in str(e.value)
    check_engine(config(*ray), internvl, processors[internvl])  # HF engines on the workers: any family
