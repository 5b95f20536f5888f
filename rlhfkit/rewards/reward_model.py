"""Reward functions backed by a trained model (`train rl --reward.model_name_or_path`).

`RewardModelFn`: a sequence-classification reward model (`rlhfkit train rm`). It follows the reward-function contract of
rewards/base.py: `queries` (prompt + response text, special tokens kept) are tokenized with the reward model's own
tokenizer (the RM may not share the policy's vocabulary, as in OpenRLHF), scored at the last token, and normalised with
the `mean` / `std` that `rlhfkit train rm` stored in the RM's config:
reward = (score - mean) / std. The raw score is logged as `reward_extra/rm_score`. With `max_len`
a query longer than that is cut to `max_len` tokens on its tokenizer's `truncation_side` (the end,
unless the tokenizer says "left"), as OpenRLHF's reward server cuts them (`rlhfkit serve-reward`).

`VisionRewardModelFn`: a reward model over images (models/vision_reward.py); each sample is the prompt's
messages with its images (`prompt_images`) and the response, rendered by the RM's own processor.

`ProcessRewardFn`: a process reward model (`rlhfkit train prm`, trained by trainers/supervised/prm.py).
The policy's response is cut into steps (`prm_layout`), the PRM reads prompt + response with its
placeholder at each step end, and P(good step) is a token reward on the step's last token
(`Scored.token_rewards`, core.compute_advantages' dense_rewards); the scalar reward is 0. Served over HTTP
(`rlhfkit serve-reward`), it answers per query its steps' P(good) and where they end beside one aggregate.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from rlhfkit.data.batch import collate
from rlhfkit.data.images import image_messages
from rlhfkit.data.steps import (
    Placeholder,
    StepSample,
    collate_steps,
    placeholder_of,
    single_token_id,
)
from rlhfkit.data.supervised import TokenSample
from rlhfkit.data.supervised_images import VisionTextFormat
from rlhfkit.errors import ConfigError, ModelError, RewardError
from rlhfkit.models import load_tokenizer
from rlhfkit.models.loading import load_policy, resolve_model_path
from rlhfkit.models.precision import model_device, on_device
from rlhfkit.models.reward import (
    batch_scores,
    load_reward_model,
    normalization,
    prm_settings,
    reward_scores,
    step_logits,
)
from rlhfkit.models.vision import load_processor
from rlhfkit.rewards.base import RewardOutput


class _ScalarRewardModel:
    """What the reward functions of a scalar reward model share: the model frozen and kept on `device`
    (with `offload`: on the CPU between calls, moved to `device` for each), its samples scored
    `micro_batch_size` at a time by the subclass's `_score` (None: a call's all at once), and the
    scores normalised with the `mean` / `std` of its config (`normalize`; else raw)."""

    def __init__(self, model, micro_batch_size: int | None, normalize: bool, device: torch.device | str,
                 offload: bool):
        self.model = model.eval().requires_grad_(False)
        self.device, self.offload = torch.device(device), offload
        if not offload:
            self.model.to(self.device)
        self.micro_batch_size = micro_batch_size
        self.mean, self.std = normalization(self.model) if normalize else (0.0, 1.0)

    def scored(self, samples: list) -> RewardOutput:
        """rewards = scores = the normalised scores of `samples`; the raw ones logged as rm_score."""
        step = self.micro_batch_size or max(len(samples), 1)
        with on_device(self.model, self.device if self.offload else None):
            scores = torch.cat([self._score(samples[i : i + step]).cpu() for i in range(0, len(samples), step)])
        rewards = (scores - self.mean) / self.std
        return RewardOutput(rewards=rewards, scores=rewards.clone(), extra_logs={"rm_score": scores})


class RewardModelFn(_ScalarRewardModel):
    """reward_func(queries, prompts, labels, **kwargs) backed by a sequence-classification RM."""

    def __init__(self, path: str | Path, micro_batch_size: int | None = 8, normalize: bool = True,
                 model=None, tokenizer=None, device: torch.device | str = "cpu", offload: bool = False,
                 max_len: int | None = None):
        """`micro_batch_size`: queries per forward (None: a call's all at once); `device`: where it scores;
        `offload`: kept on the CPU between calls, moved to `device` for each; `max_len`: most tokens of a
        query (None: no limit)."""
        super().__init__(model or load_reward_model(path), micro_batch_size, normalize, device, offload)
        self.tokenizer = tokenizer or load_tokenizer(path)
        self.max_len = max_len

    @torch.no_grad()
    def __call__(self, queries: list[str], prompts: list[str], labels: list, **kwargs) -> RewardOutput:
        return self.scored(queries)

    def tokens(self, text: str) -> list[int]:
        """The reward model's token ids of a query (no special tokens added), cut to `max_len`."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if self.max_len is None or len(ids) <= self.max_len:
            return ids
        return ids[-self.max_len :] if self.tokenizer.truncation_side == "left" else ids[: self.max_len]

    def _score(self, texts: list[str]) -> torch.Tensor:
        ids = [self.tokens(t) for t in texts]
        width = max(len(x) for x in ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
        device = model_device(self.model)
        return reward_scores(self.model, input_ids.to(device), attention.to(device))


# ---------------------------------------------------------------------------------- reward models over images
IMAGE_COLUMN = "images"  # the column of the record VisionRewardModelFn hands its format (the prompt's images)


def prompt_images(prompts: Sequence) -> dict:
    """The reward call's `prompt_images=` keyword: each prompt's opened images (`PromptItem.images`, in
    placeholder order; None for a prompt without) when any prompt has images, else nothing."""
    images = [getattr(p, "images", None) for p in prompts]
    return {"prompt_images": images} if any(images) else {}


class VisionRewardModelFn(_ScalarRewardModel):
    """reward_func(queries, prompts, labels, **kwargs) backed by a reward model over images
    (models/vision_reward.py, `rlhfkit train rm` on a vision-language model).

    Each sample is laid out as the reward model read its training pairs: the prompt's messages
    (`raw_prompts`, with one image placeholder per image of `prompt_images`, as the policy's prompt was
    rendered) and the response's text (`responses`) as the assistant's turn, rendered and tokenized by
    the reward model's own processor (data.supervised_images.VisionTextFormat: its chat template, each image
    expanded to its tokens), so it need not share the policy's processor. The score is read at the last
    token and normalised with the `mean` / `std` of its config; the raw score is logged as
    `reward_extra/rm_score`. Images an environment returns during an agent episode are not shown to it."""

    def __init__(self, path: str | Path, micro_batch_size: int | None = 8, normalize: bool = True,
                 device: torch.device | str = "cpu", offload: bool = False, model=None):
        """`micro_batch_size`: samples per forward (None: a call's all at once); `device`: where it scores;
        `offload`: kept on the CPU between calls, moved to `device` for each; `model`: the loaded reward model
        (None: loaded from `path` in float32)."""
        super().__init__(model or load_reward_model(path), micro_batch_size, normalize, device, offload)
        self.processor = load_processor(str(resolve_model_path(path)))
        self.where = f"reward model {path}"

    def sample(self, raw_prompt, response: str, images: list | None, where: str) -> TokenSample:
        """The reward model's tokens of one prompt (a string or messages; `images`: its opened images, in
        placeholder order) and its response text, with the image tensors."""
        images = list(images or [])
        fmt = VisionTextFormat(self.processor, IMAGE_COLUMN, max(1, len(images)))
        messages = image_messages(raw_prompt, len(images), where)
        return fmt.encode(messages, response, where, all_turns=False, record={IMAGE_COLUMN: images})

    @torch.no_grad()
    def __call__(self, queries: list[str], prompts: list[str], labels: list, **kwargs) -> RewardOutput:
        raw, responses = kwargs.get("raw_prompts"), kwargs.get("responses")
        if raw is None or responses is None:
            raise RewardError(f"{self.where} scores a prompt's messages and images with the response: it needs "
                              "the trainer's raw_prompts= and responses=")
        images = kwargs.get("prompt_images") or [None] * len(raw)
        return self.scored([self.sample(p, r, im, f"{self.where}, sample {i}")
                            for i, (p, r, im) in enumerate(zip(raw, responses, images))])

    def _score(self, samples: list[TokenSample]) -> torch.Tensor:
        return batch_scores(self.model, collate(samples, self.processor.tokenizer.pad_token_id))


# ---------------------------------------------------------------------------------- process reward models
def prm_layout(response: Sequence[int], newline_ids: set[int], skip_ids: set[int],
               placeholder: Placeholder | int) -> tuple[list[int], list[int], list[int]]:
    """Cut a response into steps and place the PRM's placeholder (a `data.steps.Placeholder`, or the id
    of a one-token one) at each step end; a placeholder of several tokens is inserted whole and its
    position is its last token's.

    A step ends at a run of newline tokens (the placeholder goes before the run, as in
    Math-Shepherd's "... ки\\n"), at a placeholder the policy emitted itself, or at the last response
    token that is not in `skip_ids` (EOS, padding: never read by the PRM). Newlines that follow a
    step end open no empty step.
    Returns (the PRM's response tokens, the placeholders' positions in them, each step's last
    token position in `response` (where its reward lands))."""
    if isinstance(placeholder, int):
        placeholder = Placeholder((placeholder,), ((placeholder,),))
    content = [t for t, tok in enumerate(response) if tok not in skip_ids]
    last = content[-1] if content else -1
    emitted = set(placeholder.ends(response[: last + 1]))  # placeholders the policy wrote itself
    out: list[int] = []
    marks: list[int] = []
    ends: list[int] = []
    open_step = False
    t = 0
    while t <= last:
        tok = response[t]
        if tok in newline_ids:
            j = t
            while j + 1 <= last and response[j + 1] in newline_ids:
                j += 1
            if open_step:
                out.extend(placeholder.ids)
                marks.append(len(out) - 1)
                ends.append(j)
                open_step = False
            out.extend(response[t : j + 1])
            t = j + 1
            continue
        out.append(tok)
        if t in emitted:
            marks.append(len(out) - 1)
            ends.append(t)
            open_step = False
        else:
            open_step = True
        t += 1
    if open_step:
        out.extend(placeholder.ids)
        marks.append(len(out) - 1)
        ends.append(last)
    return out, marks, ends


def newline_token_ids(tokenizer) -> set[int]:
    """The ids whose text contains a newline."""
    return {i for i in range(len(tokenizer)) if "\n" in tokenizer.decode([i])}


STEP_AGGREGATES = {  # one score of a response from its steps' P(good) [S] (a response without a step: 0)
    "min": lambda p: float(p.min()),  # the weakest step (Wang et al. 2024, Math-Shepherd, best-of-N)
    "prod": lambda p: float(p.prod()),  # P(every step good) (Lightman et al. 2023, "Let's Verify Step by Step")
    "mean": lambda p: float(p.mean()),
    "last": lambda p: float(p[-1]),  # the final step's (as an outcome reward)
}


def aggregate_steps(probs: Sequence[torch.Tensor], rule: str) -> torch.Tensor:
    """[B] one score per response from its steps' P(good) (`probs`: B tensors [S_b]) by `rule` of
    STEP_AGGREGATES; 0 for a response without a step."""
    fn = STEP_AGGREGATES[rule]
    return torch.tensor([fn(p) if p.numel() else 0.0 for p in probs], dtype=torch.float32)


def step_token_rewards(probs: Sequence[torch.Tensor], ends: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """[B, width] zeros with each response's step scores (`probs`: B tensors [S_b]) at its step ends
    (`ends`: B long tensors [S_b], indices in the response's tokens)."""
    token = torch.zeros(len(probs), width)
    for b, (p, e) in enumerate(zip(probs, ends)):
        token[b, e.long()] = p.float()
    return token


def vocabulary_fingerprint(tokenizer) -> str:
    """A short hash of a tokenizer's vocabulary (token -> id, added tokens included): equal for tokenizers
    whose token ids mean the same."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=True).encode()
    return hashlib.sha256(vocab).hexdigest()[:16]


class ProcessRewardFn:
    """Per-step rewards from a folder of `rlhfkit train prm`. The PRM must share the policy's
    vocabulary (it reads the policy's tokens as they are; checked by `check_vocabulary`).
    `aggregate`: the rule of STEP_AGGREGATES that makes the one score per response of the text
    contract (`__call__`); `micro_batch_size` None: a call's all at once."""

    def __init__(self, path: str | Path, micro_batch_size: int | None = 8, device: torch.device | str = "cpu",
                 offload: bool = False, aggregate: str = "min", dtype: str = "float32"):
        settings = prm_settings(path)
        if settings is None:
            raise ModelError(f"{path}: its config.json records no process reward model; train one with "
                             "`rlhfkit train prm`")
        if aggregate not in STEP_AGGREGATES:
            raise ConfigError(f"unknown aggregate of a process reward model's steps {aggregate!r}; "
                              f"choose one of {sorted(STEP_AGGREGATES)}")
        self.model, self.tokenizer = load_policy(str(path), dtype)
        self.model.eval().requires_grad_(False)
        self.device, self.offload = torch.device(device), offload
        if not offload:
            self.model.to(self.device)
        self.micro_batch_size, self.aggregate = micro_batch_size, aggregate
        self.placeholder = placeholder_of(self.tokenizer, settings["placeholder_token"], "the PRM's placeholder")
        self.reward_ids = [single_token_id(self.tokenizer, t, "the PRM's reward tokens")
                           for t in settings["reward_tokens"]]
        self.newline_ids = newline_token_ids(self.tokenizer)
        self.skip_ids = set(self.tokenizer.all_special_ids)

    def check_vocabulary(self, tokenizer) -> None:
        """ConfigError unless the policy's `tokenizer` has the PRM's vocabulary."""
        if tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise ConfigError("--reward.model_name_or_path: the process reward model's vocabulary differs "
                              "from the policy's; train the PRM from the policy's base model")

    @torch.no_grad()
    def steps(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per sample (token ids of its prompt and response): its steps' P(good) [S_b] and each step's
        last token in its response [S_b] (long; where `prm_layout` puts the step's reward)."""
        probs: list[torch.Tensor] = []
        ends: list[torch.Tensor] = []
        size = self.micro_batch_size or max(len(responses), 1)
        with on_device(self.model, self.device if self.offload else None):
            for i in range(0, len(responses), size):
                p, e = self._score(prompts[i : i + size], responses[i : i + size])
                probs, ends = probs + p, ends + e
        return probs, ends

    def step_rewards(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
                     ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(token rewards [B, R] with P(good step) on each step's last token, R = the longest
        response; per sample its steps' P(good) [S_b])."""
        probs, ends = self.steps(prompts, responses)
        return step_token_rewards(probs, ends, max((len(r) for r in responses), default=0)), probs

    def _score(self, prompts, responses) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """P(good) of every step of a micro-batch, and the steps' ends in the responses."""
        laid = [prm_layout(list(r), self.newline_ids, self.skip_ids, self.placeholder) for r in responses]
        rows = [list(p) + out for p, (out, _, _) in zip(prompts, laid)]
        marked = [_marked(row, len(p), marks) for row, p, (_, marks, _) in zip(rows, prompts, laid)]
        batch = collate_steps(marked, self.tokenizer.pad_token_id)
        device = model_device(self.model)
        z = step_logits(self.model, batch.input_ids.to(device), batch.attention_mask.to(device),
                        batch.step_mask.to(device), self.reward_ids)
        good = torch.softmax(z, dim=-1)[:, 0].cpu()
        out = list(good.split([len(ends) for _, _, ends in laid]))
        return out, [torch.tensor(ends, dtype=torch.long) for _, _, ends in laid]

    def score_trajectories(self, trajs) -> tuple[torch.Tensor, RewardOutput]:
        """(token rewards [B, R], a RewardOutput with scalar rewards 0 and scores = the weakest step's
        P(good) (0 without steps)) for `data.types.Trajectory`s."""
        token, probs = self.step_rewards([t.prompt_ids.tolist() for t in trajs],
                                         [t.response_ids.tolist() for t in trajs])
        return token, _output(probs)

    def __call__(self, queries: list[str], prompts: list[str], labels: list, **kwargs) -> RewardOutput:
        """The reward-function contract: per response its steps' P(good) and where they end (`steps`,
        `step_ends`), and one score, their `aggregate` (rewards = scores; 0 without a step). Token ids
        given as `prompt_ids=` and `completion_ids=` (of the PRM's vocabulary) are read as they are; else
        the prompts and the responses (`responses=`, or each query past its prompt) are tokenized."""
        prompt_ids, response_ids = kwargs.get("prompt_ids"), kwargs.get("completion_ids")
        if prompt_ids is None or response_ids is None:
            responses = kwargs.get("responses") or [q[len(p):] for q, p in zip(queries, prompts)]
            if len(responses) != len(prompts):
                raise RewardError("the process reward model got different numbers of prompts and responses")
            prompt_ids, response_ids = self._ids(prompts), self._ids(responses)
        probs, ends = self.steps(prompt_ids, response_ids)
        score = aggregate_steps(probs, self.aggregate)
        return RewardOutput(score, score.clone(), _output(probs).extra_logs, probs, ends)

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _marked(row: list[int], prompt_len: int, marks: list[int]) -> StepSample:
    ids = torch.tensor(row, dtype=torch.long)
    mask = torch.zeros(len(row), dtype=torch.bool)
    mask[[prompt_len + m for m in marks]] = True
    return StepSample(ids, mask, torch.zeros(len(row)))


def _output(probs: list[torch.Tensor]) -> RewardOutput:
    weakest = aggregate_steps(probs, "min")
    steps = torch.tensor([float(p.numel()) for p in probs])
    mean = torch.tensor([float(p.mean()) if p.numel() else float("nan") for p in probs])
    return RewardOutput(torch.zeros(len(probs)), weakest,
                        {"prm_steps": steps, "prm_step_mean": mean, "prm_step_min": weakest})
