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
engine (rollout/vllm.py: each prompt's decoded images as vLLM's multi-modal data) run with images.
Not supported with images yet (one-line errors): agent files of OpenRLHF's mid-2025
`execute(prompt, label, sampling_params)` contract, the vLLM engine for a family whose processor
wraps its image tokens in others (Gemma 3), and vLLM engines on Ray rollout workers (`check_engine`).
"""

from __future__ import annotations

from pathlib import Path

from rlhfkit.agents import ExecuteRunner, SingleTurnExecutor
from rlhfkit.api.builder import build_engine as build_text_engine
from rlhfkit.api.builder import prompt_options
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
from rlhfkit.rollout.vllm import collapse_image_runs

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


def check_executor(cfg: RLConfig, executor) -> None:
    """ConfigError (before models load) for an executor that does not run with images: only single-turn
    generation and the executors that take the processor (`processor`) do: `AgentInstance` episodes
    rlhfkit drives (MultiTurnExecutor), tool-calling and text-environment episodes (ToolExecutor), agent
    functions on the endpoint (EndpointExecutor) and OpenRLHF 2026's `AgentExecutor` with its own
    `execute(..., images=None)` (ExecuteRunner with an instance); not the mid-2025 contract's
    `execute(prompt, label, sampling_params)`, which takes no images."""
    if isinstance(executor, ExecuteRunner) and executor.instance is None:
        raise ConfigError(f"a vision-language policy ({cfg.actor.model_name_or_path}) does not run with an "
                          "AgentExecutor of OpenRLHF's mid-2025 contract (built with five arguments; its "
                          "execute(prompt, label, sampling_params) takes no images); write OpenRLHF 2026's form: "
                          "an AgentExecutorBase built with no arguments whose execute(prompt, label, sampling_params, "
                          "max_length, hf_tokenizer, llm_engine, images=None) returns the result; see docs/vision.md")
    if isinstance(executor, SingleTurnExecutor) or hasattr(executor, "processor"):
        return
    raise ConfigError(f"a vision-language policy ({cfg.actor.model_name_or_path}) does not run with "
                      f"{type(executor).__name__} yet; give an agent file with an AgentInstance or an AgentExecutor, "
                      "an agent function or tools; see docs/vision.md")


def check_engine(cfg: RLConfig) -> None:
    """ConfigError (before models load) for vLLM engines on Ray rollout workers: they are not given a
    vision-language policy's image settings yet (the vLLM engine in the trainer's process and HF
    engines on Ray workers run with images)."""
    if cfg.rollout.engine == "vllm" and cfg.distributed.backend == "ray":
        raise ConfigError(f"a vision-language policy ({cfg.actor.model_name_or_path}) does not run on vLLM engines in "
                          "Ray rollout workers yet: use --rollout.engine hf with --distributed.backend ray, or the "
                          "vllm engine in the trainer's process (--distributed.backend local)")


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
    builder.build_engine's does. vllm: builder's VLLMEngine sending each prompt's images
    (`vllm_image_settings`)."""
    if cfg.rollout.engine == "vllm":
        return build_text_engine(policy, tokenizer, cfg, state_fn,
                                 images=vllm_image_settings(cfg, processor, policy.config))
    amp = DTYPES[cfg.actor.autocast] if cfg.actor.autocast else None
    return VisionEngine(policy, tokenizer, max_batch_size=cfg.rollout.max_batch_size, autocast_dtype=amp,
                        inference_mode=not cfg.fsdp.enable, gather=fsdp.unsharded if cfg.fsdp.enable else None,
                        record_experts=cfg.actor.routing_replay)


def vllm_image_settings(cfg: RLConfig, processor, config) -> dict:
    """The VLLMEngine settings of a vision-language policy (`config`: its transformers config): its image
    token, its placeholder tokens (never sampled) and --data.max_images_per_prompt. ConfigError for a
    family whose processor does more than repeat the image token where the chat template puts one
    (Gemma 3 wraps it in others): the engine collapses each run of the image token to one for vLLM,
    which expands it again."""
    image = getattr(config, "image_token_id", None)
    image = getattr(config, "image_token_index", None) if image is None else image
    if image is None or not expands_by_repeating(processor, int(image)):
        raise ConfigError(f"--rollout.engine vllm does not send the images of {cfg.actor.model_name_or_path} yet (its "
                          "processor expands an image into more than a run of its image token, as Gemma 3's does); "
                          "use --rollout.engine hf")
    return {"image_token_id": int(image), "banned_ids": placeholder_ids(config),
            "max_images": cfg.data.max_images_per_prompt}


def expands_by_repeating(processor, image_token_id: int) -> bool:
    """Whether the processor expands a one-image chat turn by repeating `image_token_id` alone: its
    ids with each run of the image token cut to one are the template's text tokenized as it is."""
    from PIL import Image

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expanded, _ = encode(processor, text, [Image.new("RGB", (56, 56))])
    plain = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    return collapse_image_runs(expanded, image_token_id) == list(plain)


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
