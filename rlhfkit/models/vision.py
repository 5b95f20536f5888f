"""Vision-language models: detect, load, freeze the vision tower, and feed images to the forward.

A model is a vision-language model (VLM) when its config has a `vision_config` (Qwen2-VL and
Qwen2.5-VL, LLaVA, Gemma 3, Idefics3 / SmolVLM, ...). It loads with transformers'
`AutoModelForImageTextToText` and `AutoProcessor`; the processor turns a prompt's text and images
into token ids (each image placeholder expanded to the image's tokens) and the pixel tensors.

Processors without a video backend: transformers' Qwen2-VL processor builds a video processor that
needs torchvision. Where it cannot be built, the processor is assembled image-only from the
folder's image processor (transformers' PIL implementation), tokenizer and chat template
(`image_only_processor`); videos are then refused, images work as with the full processor.

The forward of a batch with images (`vision_kwargs`): the per-prompt tensors of its rows
(`data.images.VisionInputs`), concatenated row after row, plus the per-token type ids some models
take (Qwen2-VL's `mm_token_type_ids`, from which it computes its M-RoPE positions; Gemma 3's
`token_type_ids`, which open bidirectional attention among an image's tokens), derived from the
input ids so that they follow any padding. The positions of a padded row are the model's own
(Qwen2-VL computes its 3-D positions from the ids, the image grid and the attention mask).
"""

from __future__ import annotations

import functools
import inspect

import torch

from rlhfkit.errors import ConfigError, ModelError, one_line

# Where transformers keeps the vision tower and the projector of each family's base model.
TOWER_NAMES = ("visual", "vision_tower", "vision_model", "vision_encoder")
PROJECTOR_NAMES = ("multi_modal_projector", "connector", "mm_projector", "merger", "embed_vision")


def is_vision_config(config) -> bool:
    """Whether a transformers config (or config.json dict) describes a vision-language model."""
    if isinstance(config, dict):
        return config.get("vision_config") is not None
    return getattr(config, "vision_config", None) is not None


def is_vision_folder(path) -> bool:
    """Whether the model folder `path` holds a vision-language model (its config.json has a vision_config)."""
    from pathlib import Path

    from rlhfkit.models.loading import read_config_json

    return (Path(path) / "config.json").is_file() and is_vision_config(read_config_json(path))


def check_torchvision() -> None:
    """ConfigError when a torchvision is installed that does not import beside this torch (PyPI's
    torchvision wheels for Linux are CUDA builds: beside a CPU torch their operators fail to register).
    transformers imports it for every vision-language model and processor, so nothing would load;
    without torchvision at all the processor is built image-only (module docstring)."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision  # noqa: F401  (only whether it imports)
    except Exception as exc:  # noqa: BLE001  (a broken build raises RuntimeError, OSError, ImportError, ...)
        raise ConfigError(
            f"torchvision is installed but does not import beside torch {torch.__version__} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): it was built for another "
            "torch (PyPI's Linux wheels are CUDA builds). Install the build matching your torch (for a CPU torch: "
            "pip install torchvision --index-url https://download.pytorch.org/whl/cpu) or uninstall it; "
            "vision-language models run without it (images only)") from exc


def is_vision_model(model: torch.nn.Module) -> bool:
    return is_vision_config(getattr(model, "config", None))


def image_only_processor(processor_cls: type) -> type:
    """A subclass of `processor_cls` (a transformers processor taking a video processor, and maybe an
    audio feature extractor) that takes only `image_processor`, `tokenizer` and `chat_template` (and the
    class's own settings, e.g. SmolVLM's `image_seq_len`): built where the video processor cannot be
    (it needs torchvision). Its __init__ is the class's own, given None for the parts it lacks, which
    ProcessorMixin then leaves out."""
    return _image_only(processor_cls)


@functools.cache
def _image_only(processor_cls: type) -> type:
    from transformers.processing_utils import ProcessorMixin

    kept = ("image_processor", "tokenizer")
    parts = processor_cls.get_attributes()
    absent = {name: None for name in parts if name not in kept}
    own = inspect.signature(processor_cls.__init__)
    signature = own.replace(parameters=[p for name, p in own.parameters.items() if name not in absent])

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        named = {k: v for k, v in bound.arguments.items() if k != "self"}
        named.update(named.pop(next((n for n, p in signature.parameters.items() if p.kind == p.VAR_KEYWORD), ""), {}))
        processor_cls.__init__(self, **named, **absent)

    # Its own settings (e.g. InternVL's image_seq_length) stay in the signature: ProcessorMixin saves those.
    __init__.__signature__ = signature

    class WithoutAbsentParts(ProcessorMixin):
        """Next after `processor_cls` in the MRO: hands ProcessorMixin its parts without the absent ones."""

        def __init__(self, *args, **kwargs):
            kwargs.update(zip(parts, args))  # the class passes its parts by position or by name
            ProcessorMixin.__init__(self, **{k: v for k, v in kwargs.items() if k not in absent})

    methods = {"__init__": __init__, "__module__": __name__}
    owner = next(c for c in processor_cls.__mro__ if "apply_chat_template" in vars(c))
    if owner.__name__ in _VIDEO_DEFAULTS_ONLY:  # its own rendering reads the video processor's defaults
        methods["apply_chat_template"] = ProcessorMixin.apply_chat_template
    # The class keeps its name: a saved folder names the processor class transformers knows.
    return type(processor_cls.__name__, (processor_cls, WithoutAbsentParts), methods)


# Processors whose apply_chat_template differs from ProcessorMixin's only by the video processor's defaults it
# passes on (frames, fps): their image-only class renders with ProcessorMixin's.
_VIDEO_DEFAULTS_ONLY = ("SmolVLMProcessor",)


def _takes_video(processor_cls: type) -> bool:
    return "video_processor" in inspect.signature(processor_cls.__init__).parameters


def load_processor(path: str):
    """The processor of the VLM folder `path` (AutoProcessor); image-only where its video processor
    cannot be built (module docstring). ModelError naming the folder when neither loads."""
    check_torchvision()
    from transformers import AutoProcessor
    from transformers.models.auto.processing_auto import processor_class_from_name

    from rlhfkit.models.loading import load_errors

    with load_errors("a processor", path):
        try:
            processor = AutoProcessor.from_pretrained(path)
        except (ImportError, AttributeError, ValueError, OSError) as exc:
            processor, failure = None, exc
        if hasattr(processor, "image_processor"):
            return processor
        # transformers gave a bare tokenizer, or failed: a processor whose video part cannot be built
        name = _processor_class_name(path)
        if name in _WITHOUT_TORCHVISION:  # transformers cannot import the class itself without torchvision
            return _from_folder(path, _WITHOUT_TORCHVISION[name]())
        cls = processor_class_from_name(name) if name else None
        if cls is None or not _takes_video(cls):
            if processor is None:
                raise _torchvision_needed(path, name, failure) or failure
            raise ModelError(f"{path}: AutoProcessor found no image processor for this vision-language model; "
                             "add its preprocessor_config.json / processor_config.json")
        return _from_folder(path, image_only_processor(cls))


def _torchvision_needed(path: str, name: str | None, failure: Exception) -> ModelError | None:
    """A ModelError naming the processor class when transformers could not build it without torchvision, it
    takes no video processor to leave out and rlhfkit has no class of its own for it (`_WITHOUT_TORCHVISION`);
    None for another failure."""
    if not isinstance(failure, ImportError) or "torchvision" not in str(failure).lower():
        return None
    return ModelError(f"{path}: transformers' {name or 'processor'} needs torchvision even for images, and "
                      "rlhfkit cannot build it without; install the torchvision build matching your torch (for a "
                      "CPU torch: pip install torchvision --index-url https://download.pytorch.org/whl/cpu)")


def _pixtral() -> type:
    from rlhfkit.models.pixtral import pixtral_processor_class

    return pixtral_processor_class()


# Processors transformers will not import without torchvision although their images need none: rlhfkit's own
# class of the same name and settings over transformers' PIL image processor (Mistral 3's: models.pixtral).
_WITHOUT_TORCHVISION = {"PixtralProcessor": _pixtral}


def _from_folder(path: str, cls: type):
    """`cls` (a processor class) of the folder's tokenizer, PIL image processor, chat template and the
    processor's own settings; ModelError naming the package when one it needs is missing (SmolVLM's: num2words)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    image_processor = AutoImageProcessor.from_pretrained(path, backend="pil")
    template = getattr(tokenizer, "chat_template", None)
    takes = inspect.signature(cls.__init__).parameters
    settings = {k: v for k, v in _processor_config(path).items()
                if k in takes and k not in ("self", "image_processor", "tokenizer", "chat_template")}
    try:
        return cls(image_processor=image_processor, tokenizer=tokenizer,
                   chat_template=_chat_template(path) or template, **settings)
    except ImportError as exc:
        raise ModelError(f"cannot load the processor of {path}: transformers' {cls.__name__} needs a package that is "
                         f"not installed ({one_line(exc)}); install it (pip install 'rlhfkit[vision]' brings "
                         "the ones rlhfkit's vision-language families need)") from exc


def _processor_class_name(path: str) -> str | None:
    import json
    from pathlib import Path

    for name in ("processor_config.json", "preprocessor_config.json"):
        f = Path(path) / name
        if f.is_file():
            cls = json.loads(f.read_text()).get("processor_class")
            if cls:
                return cls
    return None


def _processor_config(path: str) -> dict:
    """The processor's own settings saved in the folder's processor_config.json ({} without one)."""
    import json
    from pathlib import Path

    f = Path(path) / "processor_config.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def _chat_template(path: str) -> str | None:
    from pathlib import Path

    for name in ("chat_template.jinja", "chat_template.json"):
        f = Path(path) / name
        if f.is_file():
            if name.endswith(".json"):
                import json

                return json.loads(f.read_text()).get("chat_template")
            return f.read_text()
    return None


def load_vision_model(path: str, dtype: torch.dtype = torch.float32, load_in_4bit: bool = False) -> torch.nn.Module:
    """A VLM from folder `path` with AutoModelForImageTextToText (ModelError naming the folder). With
    `load_in_4bit` (QLoRA) the language model's linear layers load as bitsandbytes' 4-bit NF4 weights
    computing in `dtype`; the vision tower, the projector and the LM head stay in `dtype`
    (`unquantized_parts`)."""
    from pathlib import Path

    check_torchvision()
    from transformers import AutoModelForImageTextToText

    from rlhfkit.models.loading import (
        _all_weights_loaded,
        keep_4bit_layout,
        load_errors,
        nf4_config,
    )

    kwargs = {}
    with load_errors("a vision-language model", path):
        if load_in_4bit:
            kwargs["quantization_config"] = nf4_config(dtype, keep=unquantized_parts(path))
        loaded = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, output_loading_info=True, **kwargs)
    return keep_4bit_layout(_all_weights_loaded(loaded, Path(path)))


def unquantized_parts(path: str) -> tuple[str, ...]:
    """The full module names of the VLM in folder `path` that QLoRA leaves unquantized: the vision tower,
    the projector and the LM head (read from its config, built on the meta device)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(path))
    names = {id(m): n for n, m in model.named_modules()}
    parts = [m for _, m in vision_parts(model, projector=True)] + [model.get_output_embeddings()]
    return tuple(names[id(m)] for m in parts if m is not None)


def plain_model_class(config):
    """The transformers auto class that builds a model of `config`: AutoModelForImageTextToText for a
    vision-language model, else AutoModelForCausalLM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The VLM's base model (vision tower + projector + language model; no LM head)."""
    from rlhfkit.models.logprobs import transformers_model

    inner = transformers_model(model)
    return getattr(inner, "model", inner)


def vision_parts(model: torch.nn.Module, projector: bool = False) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of the vision tower, and of the projector with `projector`."""
    base = base_model(model)
    names = TOWER_NAMES + (PROJECTOR_NAMES if projector else ())
    parts = [(n, getattr(base, n)) for n in names if isinstance(getattr(base, n, None), torch.nn.Module)]
    if not parts:
        raise ConfigError(f"{type(model).__name__}: no vision tower found (looked for {', '.join(TOWER_NAMES)})")
    return parts


def freeze_visual_encoder(model: torch.nn.Module, projector: bool = False) -> int:
    """Stop gradients to the vision tower (and the projector with `projector`): OpenRLHF's
    --freeze_visual_encoder. Qwen2-VL's merger (its projector) is part of its tower. Returns the
    number of parameters frozen."""
    frozen = 0
    for _, module in vision_parts(model, projector):
        for p in module.parameters():
            if p.requires_grad:
                p.requires_grad_(False)
                frozen += p.numel()
    return frozen


def language_lora_targets(model: torch.nn.Module, targets: tuple[str, ...] | str, tower: bool = False) -> list[str]:
    """The full names of the linear layers LoRA `targets` (module names, or "all-linear") picks in a VLM's
    base model outside its vision tower: the language model's and the projector's, not the LM head (as peft's
    all-linear leaves it out) nor a reward model's score head (models.vision_reward; its own head trains
    whole). With a frozen tower (--actor.freeze_visual_encoder) the adapters go there only; peft's own
    matching would also put them in the tower (its layers share names such as q_proj). `tower`: the
    tower's layers of those names too (a reward model over images whose tower trains)."""
    towers = () if tower else tuple(f"{name}." for name, _ in vision_parts(model))
    prefix = next((n for n, m in model.named_modules() if m is base_model(model)), "")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    picked = []
    for name, module in model.named_modules():
        inside = not prefix or name.startswith(prefix + ".")
        inner = name[len(prefix) + 1:] if prefix and inside else name
        if not isinstance(module, torch.nn.Linear) or module is head or not inside or inner.startswith(towers):
            continue
        if targets == "all-linear" or name.rsplit(".", 1)[-1] in targets:
            picked.append(name)
    if not picked:
        where = "in the base model" if tower else "outside the vision tower"
        raise ConfigError(f"--ds.lora.target_modules {targets}: no linear layer of that name {where} "
                          f"of {type(model).__name__}")
    return picked


def vision_split(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(base model, LM head) of a VLM whose logits are head(last hidden state): the base model
    takes the pixel values (the language model alone would not). None where the config transforms
    the logits after the head (the full forward runs)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    text = model.config.get_text_config(decoder=True)
    if head is None or getattr(text, "final_logit_softcapping", None) not in (None, 1.0):
        return None
    return base_model(model), head


def image_token_of(config) -> int | None:
    """The token a VLM's processor repeats for an image's features (`config`: its transformers config, which
    names it image_token_id or, as Gemma 3's, image_token_index); None where it names none."""
    image = getattr(config, "image_token_id", None)
    return getattr(config, "image_token_index", None) if image is None else image


# Families whose token_type_ids split a prefix LM's input rather than mark image tokens: 0 for the prefix (the
# images and the prompt, attending to each other both ways), 1 for the suffix (the response, causal): PaliGemma.
PREFIX_LM_FAMILIES = ("paligemma",)


def is_prefix_lm(config) -> bool:
    return getattr(config, "model_type", None) in PREFIX_LM_FAMILIES


def prefix_lm_types(input_ids: torch.Tensor, prompt_lengths: torch.Tensor | None) -> torch.Tensor:
    """A prefix LM's token types [B, L]: 0 for each row's first `prompt_lengths` tokens, 1 after (all 0 without)."""
    if prompt_lengths is None:
        return torch.zeros_like(input_ids)
    at = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
    return (at >= prompt_lengths.to(input_ids.device).unsqueeze(1)).long()


def token_type_kwargs(model: torch.nn.Module, input_ids: torch.Tensor,
                      prompt_lengths: torch.Tensor | None = None) -> dict:
    """The per-token type ids the model takes beside its ids, derived from them: image tokens 1
    (Qwen2-VL's `mm_token_type_ids`, video tokens 2; Gemma 3's `token_type_ids`). [B, L] each. A prefix
    LM's (PaliGemma): 0 for each row's first `prompt_lengths` tokens, 1 after (all 0 without them: the
    whole input is the prefix, as its processor types a prompt without a suffix)."""
    from rlhfkit.models.logprobs import forward_parameters

    config = model.config
    if is_prefix_lm(config):
        return {"token_type_ids": prefix_lm_types(input_ids, prompt_lengths)}
    image = image_token_of(config)
    takes = forward_parameters(model)
    out = {}
    if image is None:
        return out
    types = (input_ids == image).long()
    video = getattr(config, "video_token_id", None)
    if video is not None:
        types = types + 2 * (input_ids == video).long()
    for name in ("mm_token_type_ids", "token_type_ids"):
        if name in takes:
            out[name] = types
    return out


def vision_kwargs(model: torch.nn.Module, batch, device: torch.device) -> dict:
    """The forward's image inputs of `batch` (a TokenBatch whose `vision` lists its rows'
    VisionInputs or None): the rows' tensors concatenated in row order, and the token type ids (a prefix
    LM's from the batch's `prompt_lengths`)."""
    from rlhfkit.models.precision import to_device

    rows = getattr(batch, "vision", None)
    if rows is None:
        return {}
    length = batch.input_ids.shape[1]
    out = {k: to_device(v, device) for k, v in concat_vision(rows, length).items()}
    if out:
        prompts = getattr(batch, "prompt_lengths", None)
        out.update(token_type_kwargs(model, to_device(batch.input_ids, device), prompts))
    return out


# Image inputs laid out per token of the prompt ([1, prompt tokens, ...]): Llama 3.2 Vision's cross-attention mask
# (which of the images' tiles each token attends to).
PER_TOKEN_KEYS = ("cross_attention_mask",)


def concat_vision(rows, length: int | None = None) -> dict[str, torch.Tensor]:
    """The image tensors of several rows for one forward: each key's tensors (`row.tensors`, dim 0
    indexing the row's images or their patches) concatenated in row order; rows without images
    (None) add nothing. The model scatters the features into the image tokens in the same order.
    Tensors laid out per prompt (Idefics3 / SmolVLM: [1, sub-images, C, H, W] and the pixel mask)
    whose rows differ in size past dim 0 are padded with zeros to the largest first, as the model's
    processor pads a batch of prompts (the model drops all-zero sub-images). Per-token tensors
    (PER_TOKEN_KEYS) cover `length` tokens: the tokens after a row's prompt (its response, its padding)
    take its last token's row, as transformers' generate extends them."""
    present = [r for r in rows if r is not None and r.tensors]
    keys = sorted({k for r in present for k in r.tensors})
    out = {}
    for k in keys:
        tensors = [r.tensors[k] for r in present if k in r.tensors]
        if k in PER_TOKEN_KEYS and length is not None:
            tensors = [per_token(t, length) for t in tensors]
        out[k] = _cat_padded(tensors)
    return out


def per_token(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """A per-token tensor [b, L, ...] cut or extended to `length` tokens, the new ones taking the last token's row."""
    if tensor.shape[1] >= length:
        return tensor[:, :length]
    more = tensor[:, -1:].expand(-1, length - tensor.shape[1], *tensor.shape[2:])
    return torch.cat([tensor, more], dim=1)


def _cat_padded(tensors: list[torch.Tensor]) -> torch.Tensor:
    shape = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
    padded = []
    for t in tensors:
        if list(t.shape[1:]) != shape:
            out = t.new_zeros(t.shape[0], *shape)
            out[(slice(None), *(slice(0, n) for n in t.shape[1:]))] = t
            t = out
        padded.append(t)
    return torch.cat(padded)


# ------------------------------------------------------------------ memory plan
DEFAULT_IMAGE_TOKENS = 256  # a variable-resolution model (Qwen2-VL): a 448 x 448 image, 14-pixel patches merged 2x2


def vision_sizes(config: dict, image_tokens: int | None = None) -> dict:
    """Sizes of a vision-language model from its config.json `config`, nothing loaded: parameters
    (`total`, `tower`, `projector`; exact, counted on the meta device), `image_tokens` (language-model
    tokens per image: the config's fixed count, else `image_tokens`, else DEFAULT_IMAGE_TOKENS),
    `patches` (vision-tower tokens per image), the tower's `width`, `intermediate`, `layers`, `heads`, and
    `text`: the language model's whole config (defaults filled in) as a dict."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    fields = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(hf_config)

    def count(parts) -> int:
        return sum(p.numel() for _, m in parts for p in m.parameters())

    tower = count(vision_parts(model))
    projector = count(vision_parts(model, projector=True)) - tower
    v = hf_config.vision_config
    width = getattr(v, "embed_dim", None) or v.hidden_size
    intermediate = getattr(v, "intermediate_size", None) or int(width * getattr(v, "mlp_ratio", 4))
    fixed, merge = image_layout(hf_config)
    tokens = fixed or image_tokens or DEFAULT_IMAGE_TOKENS
    return {"total": sum(p.numel() for p in model.parameters()), "tower": tower, "projector": projector,
            "text": hf_config.get_text_config(decoder=True).to_dict(),
            "image_tokens": tokens, "fixed_tokens": fixed is not None, "patches": round(tokens * merge),
            "width": width, "intermediate": intermediate, "layers": getattr(v, "depth", None) or v.num_hidden_layers,
            "heads": getattr(v, "num_heads", None) or v.num_attention_heads}


def image_layout(hf_config) -> tuple[int | None, float]:
    """(language-model tokens per image when the config fixes them, else None; vision-tower patches per
    language-model token). Fixed: LLaVA (one token per patch of its square image), Gemma 3
    (`mm_tokens_per_image`, pooled from the patches). Variable: Qwen-VL and Mistral 3 (patches merged
    spatial_merge_size^2 to a token), Idefics3 / SmolVLM (a tile per sub-image, pixel-shuffled
    scale_factor^2), InternVL (tiles, downsampled by downsample_ratio a side), Gemma 4 (pooled
    pooling_kernel_size^2, as many tokens as the image's aspect ratio gives)."""
    v = hf_config.vision_config

    def side(x):
        return x[0] if isinstance(x, (list, tuple)) else x

    size, patch = side(getattr(v, "image_size", None)), side(getattr(v, "patch_size", None))
    grid = (size // patch) ** 2 if size and patch else None
    for merge in (getattr(v, "spatial_merge_size", None) and v.spatial_merge_size ** 2,
                  getattr(hf_config, "spatial_merge_size", None) and hf_config.spatial_merge_size ** 2,
                  getattr(hf_config, "scale_factor", None) and hf_config.scale_factor ** 2,
                  getattr(hf_config, "downsample_ratio", None) and 1 / hf_config.downsample_ratio ** 2,
                  getattr(v, "pooling_kernel_size", None) and v.pooling_kernel_size ** 2):
        if merge:
            return None, merge
    fixed = getattr(hf_config, "mm_tokens_per_image", None)
    if fixed is not None:
        return fixed, grid / fixed if grid else 1
    return grid, 1


def tower_activation_bytes(sizes: dict, images: int, compute_bytes: int) -> int:
    """Activations the vision tower keeps for backward over `images` images: per layer and patch
    ~ 6w + 4i values plus heads x patches attention probabilities (as models.memory's decoder term)."""
    n = sizes["patches"]
    per_patch_layer = 6 * sizes["width"] + 4 * sizes["intermediate"] + sizes["heads"] * n
    return sizes["layers"] * images * n * per_patch_layer * compute_bytes
