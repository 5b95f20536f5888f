"""Vision-language models in the trainers: what `RLTrainer.from_config` (and, at the end, the SFT, DPO
and KTO trainers') does differently when the model's config has a vision_config (docs/vision.md).

Before any model loads, the prompt data is checked (`check_data`): with a VLM, every image opens and
fits; with a text-only model, a record that holds images is refused. Then the policy's vision tower
is frozen with --actor.freeze_visual_encoder (the reference shares it: the same frozen values),
prompts are rendered and tokenized by the model's processor (image tokens expanded, pixel tensors
kept per prompt), and the rollout runs on a `VisionEngine`. The final folder holds the processor
beside the weights, so AutoProcessor loads it.

Agent files whose `AgentInstance` episodes rlhfkit drives (`MultiTurnExecutor`) and agent
functions (the OpenAI-compatible endpoint) run with images: the executor gets the processor
(`attach_processor`) to encode the images `step()` returns or the agent's requests send. So do
tool-calling and text-environment episodes (`ToolExecutor`): its processor renders and encodes the
prompts with their images and the tool schemas; and agent files whose `AgentExecutor` has its own
`execute` (OpenRLHF 2026's form, `ExecuteRunner`): it gets the processor as `hf_tokenizer` and the
prompt's images, and `llm_engine.generate` takes `multi_modal_data` images.

LoRA (--ds.lora.rank) adapts the language model and the projector, and the tower unless it is frozen
(api/builder.py); the final adapter folder holds the processor (in the SFT, DPO and KTO trainers too).

Estimators with a critic (gae) build it from the VLM: its values see the images (models/critic.py).

Ray rollout workers (distributed/), FSDP (distributed/fsdp.py), QLoRA (models/vision.py) and the vLLM
engine, in the trainer's process or on Ray rollout workers (rollout/vllm.py: each prompt's decoded images
as vLLM's multi-modal data, its image tokens as the placeholders vLLM expands: rollout/vllm_images.py),
run with images. Not supported with images yet (one-line errors): agent files of OpenRLHF's mid-2025
`execute(prompt, label, sampling_params)` contract, and the vLLM engine for a family whose image tokens
rlhfkit does not turn back into vLLM's placeholders (`check_engine`: SmolVLM, Idefics3, InternVL, Gemma 4,
Gemma 3 with pan and scan).
"""

from __future__ import annotations

from pathlib import Path

from rlhfkit.agents import ExecuteRunner, SingleTurnExecutor
from rlhfkit.api.builder import prompt_options
from rlhfkit.api.engines import build_engine as build_text_engine
from rlhfkit.config import RLConfig
from rlhfkit.data.images import (
    check_vision_prompts,
    encode,
    load_vision_prompts,
    refuse_images_for_text_model,
)
from rlhfkit.data.images import tokenize_vision_prompts as tokenize
from rlhfkit.data.supervised_images import VisionTextFormat, check_supervised_images
from rlhfkit.distributed import fsdp
from rlhfkit.errors import ConfigError
from rlhfkit.models.loading import resolve_model
from rlhfkit.models.precision import DTYPES
from rlhfkit.models.vision import (
    base_model,
    check_torchvision,
    freeze_visual_encoder,
    is_vision_folder,
    load_processor,
    vision_parts,
)
from rlhfkit.rollout.vision import VisionEngine, placeholder_ids
from rlhfkit.rollout.vllm_images import ImagePrompt, image_prompt_of, vllm_prompt_ids

PACKAGED_TEXT_MODELS = ("smollm2",)


def policy_folder(cfg: RLConfig) -> str | None:
    """The actor's model folder when it is a vision-language model, else None (nothing is converted)."""
    name = cfg.actor.model_name_or_path
    if name in PACKAGED_TEXT_MODELS or name.endswith(".gguf"):
        return None
    path, _ = resolve_model(name)
    if not is_vision_folder(path):
        return None
    check_torchvision()
    return path


def data_options(cfg: RLConfig, eval: bool = False, shuffle: bool = True) -> dict:
    """The keyword arguments of data.images' loaders besides the source: `builder.prompt_options`' keys,
    split, config, data dir, max_samples and seed (no template: the processor's chat template renders),
    and the image settings. `shuffle` False: the records in file order (`rlhfkit eval`'s first
    --eval.max_samples)."""
    options = prompt_options(cfg, eval)
    del options["apply_chat_template"], options["input_template"]
    if not shuffle:
        options["shuffle_seed"] = None
    return {**options, "image_key": cfg.data.image_key, "max_images": cfg.data.max_images_per_prompt}


def check_data(cfg: RLConfig, dataset, vision: bool, eval: bool = False, shuffle: bool = True) -> None:
    """Before models load: a VLM's prompts and images (every image decoded), or no images for a text model."""
    options = data_options(cfg, eval, shuffle)
    if vision:
        check_vision_prompts(dataset, **options)
        return
    options.pop("max_images"), options.pop("label_key")
    refuse_images_for_text_model(dataset, model=cfg.actor.model_name_or_path, **options)


def check_executor(cfg: RLConfig, executor, folder: str | None = None) -> None:
    """ConfigError (before models load) for an executor that does not run with images: only single-turn
    generation and the executors that take the processor (`processor`) do: `AgentInstance` episodes
    rlhfkit drives (MultiTurnExecutor), tool-calling and text-environment episodes (ToolExecutor), agent
    functions on the endpoint (EndpointExecutor) and OpenRLHF 2026's `AgentExecutor` with its own
    `execute(..., images=None)` (ExecuteRunner with an instance); not the mid-2025 contract's
    `execute(prompt, label, sampling_params)`, which takes no images. PaliGemma and Llama 3.2 Vision run
    single-turn generation only (SINGLE_TURN_FAMILIES), read from `folder` (the policy's, `policy_folder`: a hub
    model's is its download; default: --actor.model_name_or_path)."""
    if isinstance(executor, ExecuteRunner) and executor.instance is None:
        raise ConfigError(f"a vision-language policy ({cfg.actor.model_name_or_path}) does not run with an "
                          "AgentExecutor of OpenRLHF's mid-2025 contract (built with five arguments; its "
                          "execute(prompt, label, sampling_params) takes no images); write OpenRLHF 2026's form: "
                          "an AgentExecutorBase built with no arguments whose execute(prompt, label, sampling_params, "
                          "max_length, hf_tokenizer, llm_engine, images=None) returns the result; see docs/vision.md")
    if isinstance(executor, SingleTurnExecutor):
        return
    family = SINGLE_TURN_FAMILIES.get(_model_type(folder or cfg.actor.model_name_or_path))
    if family:
        raise ConfigError(f"a {family} policy ({cfg.actor.model_name_or_path}) does not run agent episodes yet: its "
                          "inputs are laid out for one prompt and one response (PaliGemma's prefix and suffix, Llama "
                          "3.2 Vision's per-token cross-attention mask), and a later call's context would be "
                          "typed otherwise by the rollout than by the trainer; use single-turn prompts")
    if hasattr(executor, "processor"):
        return
    raise ConfigError(f"a vision-language policy ({cfg.actor.model_name_or_path}) does not run with "
                      f"{type(executor).__name__} yet; give an agent file with an AgentInstance or an AgentExecutor, "
                      "an agent function or tools; see docs/vision.md")


# model_type -> the family's name: vision-language families whose inputs hold one prompt and one response.
SINGLE_TURN_FAMILIES = {"paligemma": "PaliGemma", "mllama": "Llama 3.2 Vision"}


def _model_type(name: str) -> str | None:
    """The model_type of the local model folder `name` (None for anything else)."""
    from rlhfkit.models.loading import read_config_json

    return read_config_json(name).get("model_type") if (Path(name) / "config.json").is_file() else None


def check_engine(cfg: RLConfig, folder: str, processor) -> None:
    """ConfigError (before models load) for --rollout.engine vllm (in the trainer's process or on Ray rollout
    workers) with a policy whose images it does not send (`vllm_image_settings`); `processor` is the
    policy's (`processor_of(folder)`)."""
    if cfg.rollout.engine == "vllm":
        from transformers import AutoConfig

        vllm_image_settings(cfg, processor, AutoConfig.from_pretrained(folder))


def attach_processor(processor, max_images: int, *executors) -> None:
    """Give the executors that take one (MultiTurnExecutor, ToolExecutor, EndpointExecutor) the policy's
    processor (it encodes the environment_images, renders and encodes tool episodes' prompts with their
    images, the agent's image parts) and the most images an episode may hold (--data.max_images_per_prompt,
    the prompt's counted)."""
    for executor in executors:
        if hasattr(executor, "processor"):
            executor.processor, executor.max_images = processor, max_images


def prepare_policy(cfg: RLConfig, policy, ref, critic=None) -> None:
    """--actor.freeze_visual_encoder: no gradients to the policy's vision tower, nor to the critic's
    (its own copy, built from the VLM: models.critic); the reference (a copy on the same device) then
    holds the very same tower modules as the policy, not a second copy (under FSDP it keeps its own:
    each model is sharded on its own, distributed.fsdp)."""
    if not cfg.actor.freeze_visual_encoder:
        return
    freeze_visual_encoder(policy)
    if critic is not None:
        freeze_visual_encoder(critic.backbone)
    if ref is not None and ref is not policy and not cfg.ref.offload and not cfg.fsdp.enable:
        for name, module in vision_parts(policy):
            setattr(base_model(ref), name, module)


def prompts(cfg: RLConfig, dataset, processor, eval: bool = False, shuffle: bool = True):
    """(PromptItems with their image tensors, number skipped as too long)."""
    examples = load_vision_prompts(dataset, processor, **data_options(cfg, eval, shuffle))
    return tokenize(examples, processor, cfg.data.prompt_max_len, cfg.data.input_key)


def build_engine(policy, tokenizer, cfg: RLConfig, processor, state_fn=None):
    """--rollout.engine hf: the HF engine for images, sharing the policy module (weight sync is a
    version bump); under FSDP it decodes through the policy's gathered parameters, as
    engines.build_engine's does. vllm: engines' VLLMEngine sending each prompt's images
    (`vllm_image_settings`)."""
    if cfg.rollout.engine == "vllm":
        return build_text_engine(policy, tokenizer, cfg, state_fn,
                                 images=vllm_image_settings(cfg, processor, policy.config))
    amp = DTYPES[cfg.actor.autocast] if cfg.actor.autocast else None
    return VisionEngine(policy, tokenizer, max_batch_size=cfg.rollout.max_batch_size, autocast_dtype=amp,
                        inference_mode=not cfg.fsdp.enable, gather=fsdp.unsharded if cfg.fsdp.enable else None,
                        record_experts=cfg.actor.routing_replay)


def vllm_image_settings(cfg: RLConfig, processor, config) -> dict:
    """The VLLMEngine settings of a vision-language policy (`config`: its transformers config): how its images
    stand in vLLM's token prompts (`rollout.vllm_images.ImagePrompt`), its placeholder tokens (never sampled)
    and --data.max_images_per_prompt. ConfigError for a family whose image tokens rlhfkit does not turn into
    the placeholders vLLM expands (`matches_template`: checked on a one-image chat turn)."""
    prompt = image_prompt_of(config, processor.tokenizer)
    if prompt is None or not matches_template(processor, prompt) or pan_and_scan(processor):
        raise ConfigError(f"--rollout.engine vllm does not send the images of {cfg.actor.model_name_or_path} yet: its "
                          "processor expands an image into tokens rlhfkit does not turn back into the placeholder "
                          "vLLM expands (a run of one image token, or Gemma 3's <start_of_image> span without "
                          "pan and scan, its tokenizer holding tokens of one to four newlines; docs/vision.md); use "
                          "--rollout.engine hf")
    return {"image_prompt": prompt, "banned_ids": placeholder_ids(config), "max_images": cfg.data.max_images_per_prompt}


def matches_template(processor, prompt: ImagePrompt) -> bool:
    """Whether a one-image chat turn, as the processor expands it, becomes the template's text tokenized as it is
    (one placeholder for the image, what vLLM expands) under `prompt`'s rule."""
    from PIL import Image

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expanded, _ = encode(processor, text, [Image.new("RGB", (56, 56))])
    plain = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    try:
        return vllm_prompt_ids(expanded, prompt) == (list(plain), 1)
    except ConfigError:
        return False


def pan_and_scan(processor) -> bool:
    """Whether Gemma 3's processor crops images (pan and scan: more spans and text per image)."""
    return bool(getattr(getattr(processor, "image_processor", None), "do_pan_and_scan", False))


def processor_of(folder: str):
    return load_processor(folder)


def save_processor(processor, folder: str | Path | None, rank: int = 0) -> None:
    """The processor's files (image processor, chat template, tokenizer) into a saved model folder (by
    rank 0 alone under FSDP; nothing when `folder` is None: no model was saved there)."""
    if processor is not None and folder is not None and rank == 0:
        processor.save_pretrained(str(folder))


# ------------------------------------------------------------------ SFT, DPO and KTO
SUPERVISED_KINDS = ("sft", "rm", "dpo", "kto")


def supervised_folder(kind: str, cfg) -> str | None:
    """The supervised model's folder when it is a vision-language model (ConfigError for a kind that
    does not train one yet), else None."""
    name = cfg.model.model_name_or_path
    if name in PACKAGED_TEXT_MODELS or name.endswith(".gguf"):
        return None
    path, _ = resolve_model(name)
    if not is_vision_folder(path):
        return None
    check_torchvision()
    if kind not in SUPERVISED_KINDS:
        raise ConfigError(f"train {kind} does not train a vision-language model ({name}) yet; train sft, "
                          "train rm, train dpo and train kto do (docs/vision.md)")
    return path


def check_supervised_data(kind: str, cfg, source, eval: bool = False) -> None:
    """Before models load: the images of a supervised dataset (every image decoded; counts)."""
    d = cfg.data
    keys = {"sft": (d.input_key,), "kto": (d.prompt_key or "prompt",)}.get(kind, (d.prompt_key, d.chosen_key,
                                                                                  d.rejected_key))
    where = ({"split": d.eval_dataset_split, "config": d.eval_dataset_config, "data_dir": d.eval_data_dir} if eval
             else {"split": d.dataset_split, "config": d.dataset_config, "data_dir": d.data_dir,
                   "max_samples": d.max_samples, "seed": cfg.train.seed})
    check_supervised_images(source, keys, d.image_key, d.max_images_per_prompt, **where)


def supervised_format(cfg, processor, source) -> VisionTextFormat:
    base = Path(source).parent if isinstance(source, (str, Path)) and Path(source).is_file() else None
    return VisionTextFormat(processor, cfg.data.image_key, cfg.data.max_images_per_prompt, base)
