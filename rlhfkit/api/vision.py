"""Vision-language models in the trainers: what `RLTrainer.from_config` (and, at the end, the SFT and
DPO trainers') does differently when the model's config has a vision_config (docs/vision.md).

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
prompts with their images and the tool schemas.

LoRA (--ds.lora.rank) adapts the language model and the projector, and the tower unless it is frozen
(api/builder.py); the final adapter folder holds the processor (in the SFT and DPO trainers too).

Estimators with a critic (gae) build it from the VLM: its values see the images (models/critic.py).

Not supported with images yet (one-line errors): the vllm engine, Ray rollout workers, FSDP,
QLoRA, agent files with their own `execute()`.
"""

from __future__ import annotations

from pathlib import Path

from rlhfkit.agents import SingleTurnExecutor
from rlhfkit.api.builder import prompt_options
from rlhfkit.config import RLConfig
from rlhfkit.data.images import (
    check_vision_prompts,
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
    freeze_visual_encoder,
    is_vision_folder,
    load_processor,
    vision_parts,
)
from rlhfkit.rollout.vision import VisionEngine

PACKAGED_TEXT_MODELS = ("smollm2",)


def policy_folder(cfg: RLConfig) -> str | None:
    """The actor's model folder when it is a vision-language model, else None (nothing is converted)."""
    name = cfg.actor.model_name_or_path
    if name in PACKAGED_TEXT_MODELS or name.endswith(".gguf"):
        return None
    path, _ = resolve_model(name)
    return path if is_vision_folder(path) else None


def data_options(cfg: RLConfig, eval: bool = False) -> dict:
    """The keyword arguments of data.images' loaders besides the source: `builder.prompt_options`' keys,
    split, config, data dir, max_samples and seed (no template: the processor's chat template renders),
    and the image settings."""
    options = prompt_options(cfg, eval)
    del options["apply_chat_template"], options["input_template"]
    return {**options, "image_key": cfg.data.image_key, "max_images": cfg.data.max_images_per_prompt}


def check_data(cfg: RLConfig, dataset, vision: bool, eval: bool = False) -> None:
    """Before models load: a VLM's prompts and images (every image decoded), or no images for a text model."""
    options = data_options(cfg, eval)
    if vision:
        refuse_unsupported(cfg)
        check_vision_prompts(dataset, **options)
        return
    options.pop("max_images"), options.pop("label_key")
    refuse_images_for_text_model(dataset, model=cfg.actor.model_name_or_path, **options)


def refuse_unsupported(cfg: RLConfig) -> None:
    """ConfigError for the settings that do not run with a vision-language policy yet."""
    blocked = [
        (cfg.rollout.engine == "vllm", "--rollout.engine vllm (use hf)"),
    ]
    for hit, what in blocked:
        if hit:
            raise ConfigError(f"a vision-language policy ({cfg.actor.model_name_or_path}) does not run with {what} "
                              "yet; see docs/vision.md")


def check_executor(cfg: RLConfig, executor) -> None:
    """ConfigError (before models load) for an executor that does not run with images yet: only
    single-turn generation and the executors that take the processor (`processor`): `AgentInstance`
    episodes rlhfkit drives (MultiTurnExecutor), tool-calling and text-environment episodes
    (ToolExecutor) and agent functions on the endpoint (EndpointExecutor)."""
    if isinstance(executor, SingleTurnExecutor) or hasattr(executor, "processor"):
        return
    raise ConfigError(f"a vision-language policy ({cfg.actor.model_name_or_path}) does not run with "
                      f"{type(executor).__name__} yet (an AgentExecutor with its own execute()); give an agent "
                      "file with an AgentInstance, an agent function or tools; see docs/vision.md")


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


def prompts(cfg: RLConfig, dataset, processor, eval: bool = False):
    """(PromptItems with their image tensors, number skipped as too long)."""
    examples = load_vision_prompts(dataset, processor, **data_options(cfg, eval))
    return tokenize(examples, processor, cfg.data.prompt_max_len, cfg.data.input_key)


def build_engine(policy, tokenizer, cfg: RLConfig) -> VisionEngine:
    """The HF engine for images, sharing the policy module (weight sync is a version bump); under FSDP
    it decodes through the policy's gathered parameters, as builder.build_engine's does."""
    amp = DTYPES[cfg.actor.autocast] if cfg.actor.autocast else None
    return VisionEngine(policy, tokenizer, max_batch_size=cfg.rollout.max_batch_size, autocast_dtype=amp,
                        inference_mode=not cfg.fsdp.enable, gather=fsdp.unsharded if cfg.fsdp.enable else None)


def processor_of(folder: str):
    return load_processor(folder)


def save_processor(processor, folder: str | Path | None, rank: int = 0) -> None:
    """The processor's files (image processor, chat template, tokenizer) into a saved model folder (by
    rank 0 alone under FSDP; nothing when `folder` is None: no model was saved there)."""
    if processor is not None and folder is not None and rank == 0:
        processor.save_pretrained(str(folder))


# ------------------------------------------------------------------ SFT and DPO
SUPERVISED_KINDS = ("sft", "dpo")


def supervised_folder(kind: str, cfg) -> str | None:
    """The supervised model's folder when it is a vision-language model (ConfigError for a kind that
    does not train one yet), else None."""
    name = cfg.model.model_name_or_path
    if name in PACKAGED_TEXT_MODELS or name.endswith(".gguf"):
        return None
    path, _ = resolve_model(name)
    if not is_vision_folder(path):
        return None
    if kind not in SUPERVISED_KINDS:
        raise ConfigError(f"train {kind} does not train a vision-language model ({name}) yet; train sft and "
                          "train dpo do (docs/vision.md)")
    return path


def check_supervised_data(kind: str, cfg, source, eval: bool = False) -> None:
    """Before models load: the images of a supervised dataset (every image decoded; counts)."""
    d = cfg.data
    keys = (d.input_key,) if kind == "sft" else (d.prompt_key, d.chosen_key, d.rejected_key)
    where = ({"split": d.eval_dataset_split, "config": d.eval_dataset_config, "data_dir": d.eval_data_dir} if eval
             else {"split": d.dataset_split, "config": d.dataset_config, "data_dir": d.data_dir,
                   "max_samples": d.max_samples, "seed": cfg.train.seed})
    check_supervised_images(source, keys, d.image_key, d.max_images_per_prompt, **where)


def supervised_format(cfg, processor, source) -> VisionTextFormat:
    base = Path(source).parent if isinstance(source, (str, Path)) and Path(source).is_file() else None
    return VisionTextFormat(processor, cfg.data.image_key, cfg.data.max_images_per_prompt, base)
