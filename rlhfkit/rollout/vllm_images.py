"""A vision-language policy's prompt ids as vLLM's token prompt: each image's tokens, as the HF processor
expanded them for the trainer, replaced by the placeholder vLLM's own multimodal processor of the family
expands again.

vLLM takes a token prompt with images as not yet expanded: its processor finds each image's placeholder in
the ids and replaces it with that image's tokens itself (`BaseMultiModalProcessor._apply_hf_processor_main`
treats a token prompt as carrying no prompt updates; `_apply_prompt_updates` then applies the family's
`PromptReplacement`). So the ids sent hold one placeholder per image, the form the chat template writes:

- Families whose processor repeats one image token (the Qwen-VL families, LLaVA): vLLM's replacement is
  that token repeated to the image's feature count, so each run of it is cut to one token.
- Gemma 3 (vLLM's `model_executor/models/gemma3_mm.py`): the target is `<start_of_image>` (BOI) and the
  replacement the tokens of the processor's `full_image_sequence`, "\\n\\nBOI" + N soft tokens + "EOI\\n\\n",
  after which vLLM merges newline tokens that met ([\\n, \\n\\n] and [\\n\\n, \\n] into \\n\\n\\n,
  [\\n\\n, \\n\\n] into \\n\\n\\n\\n), as the tokenizer would have written them. The HF processor
  expands the same text before tokenizing, so the two newlines on each side of an image are merged into its
  neighbours' newline tokens. Each span BOI soft+ EOI is cut to BOI and two newlines are taken off the
  newline tokens on either side (the run of newline tokens next to the span, re-written as fewest tokens
  of the shortened run: a token of k newlines becomes one of k - 2, none for k = 2). vLLM merges newline
  tokens only up to four: next to an image, a run of three or more newlines of the prompt's own text
  reaches vLLM split otherwise than the HF processor's ids hold it (vLLM's limit; the trainer's forward
  keeps its ids). Pan and scan (crops, each a span, with text between) is not mapped back.

`ImagePrompt` says which of these a family takes (`image_prompt_of`, from its config and tokenizer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlhfkit.errors import ConfigError
from rlhfkit.models.vision import image_token_of

VLLM_NEWLINES = 4  # vLLM's Gemma 3 processor looks up the tokens of one to four newlines
MAX_NEWLINES = 64  # longest newline token looked for
WRAPPED = ("gemma3",)  # model_type: BOI soft* EOI, with two newlines either side (module docstring)


@dataclass(frozen=True)
class ImagePrompt:
    """How a family's images stand in vLLM's token prompt.

    image_token_id: the token the HF processor repeats for an image's features.
    boi_id, eoi_id: the tokens opening and closing each image's span (Gemma 3's <start_of_image>,
      <end_of_image>); None: an image is a run of `image_token_id` alone.
    newline_ids: the tokens of 1, 2, ... newlines, as many as the tokenizer has in a row from one (with
      `boi_id`: the newlines of the span are merged into them).
    """

    image_token_id: int
    boi_id: int | None = None
    eoi_id: int | None = None
    newline_ids: tuple[int, ...] = ()


def image_prompt_of(config, tokenizer) -> ImagePrompt | None:
    """The ImagePrompt of a vision-language model (`config`: its transformers config), or None where it has no
    image token, or (Gemma 3) its tokenizer lacks a newline token vLLM's processor looks up."""
    image = image_token_of(config)
    if image is None:
        return None
    if getattr(config, "model_type", None) not in WRAPPED:
        return ImagePrompt(int(image))
    vocab = tokenizer.get_vocab()
    newlines = []
    while len(newlines) < MAX_NEWLINES and "\n" * (len(newlines) + 1) in vocab:
        newlines.append(int(vocab["\n" * (len(newlines) + 1)]))
    if len(newlines) < VLLM_NEWLINES:
        return None
    return ImagePrompt(int(image), int(config.boi_token_index), int(config.eoi_token_index), tuple(newlines))


def vllm_prompt_ids(ids: Sequence[int], prompt: ImagePrompt) -> tuple[list[int], int]:
    """(`ids` with each image's tokens replaced by vLLM's placeholder, how many placeholders vLLM finds in them:
    one per image unless the ids hold a stray one, e.g. an agent's feedback cut short without its images)."""
    if prompt.boi_id is None:
        out = collapse_image_runs(ids, prompt.image_token_id)
        return out, out.count(prompt.image_token_id)
    return unwrap_images(ids, prompt)


def collapse_image_runs(ids: Sequence[int], image_token_id: int) -> list[int]:
    """`ids` with each run of `image_token_id` (an image's tokens, as the HF processor expanded them)
    cut to one token: the input placeholder vLLM expands itself."""
    out: list[int] = []
    for t in map(int, ids):
        if t != image_token_id or not out or out[-1] != image_token_id:
            out.append(t)
    return out


def unwrap_images(ids: Sequence[int], prompt: ImagePrompt) -> tuple[list[int], int]:
    """Gemma 3: each span BOI soft+ EOI cut to BOI and two newlines taken off the newline tokens on either side
    (module docstring); (the ids, the number of BOI tokens in them). ConfigError where a span lacks its newlines."""
    rest, out, i = [int(t) for t in ids], [], 0
    while i < len(rest):
        end = span_end(rest, i, prompt)
        if end is None:
            out.append(rest[i])
            i += 1
            continue
        start = len(out)
        while start > 0 and out[start - 1] in prompt.newline_ids:
            start -= 1
        out[start:] = fewer_newlines(out[start:], prompt.newline_ids)
        out.append(int(prompt.boi_id))
        i = stop = end
        while stop < len(rest) and rest[stop] in prompt.newline_ids:
            stop += 1
        rest[i:stop] = fewer_newlines(rest[i:stop], prompt.newline_ids)
    return out, out.count(prompt.boi_id)


def span_end(ids: list[int], i: int, prompt: ImagePrompt) -> int | None:
    """The index after the span BOI soft+ EOI starting at `i`, or None where none starts there."""
    if ids[i] != prompt.boi_id:
        return None
    j = i + 1
    while j < len(ids) and ids[j] == prompt.image_token_id:
        j += 1
    return j + 1 if j > i + 1 and j < len(ids) and ids[j] == prompt.eoi_id else None


def fewer_newlines(run: Sequence[int], newline_ids: Sequence[int]) -> list[int]:
    """A run of newline tokens (k newlines in all) as the fewest tokens of k - 2 newlines, longest first.
    ConfigError for k < 2: not the newlines Gemma 3's processor puts on each side of an image."""
    k = sum(newline_ids.index(t) + 1 for t in run)
    if k < 2:
        raise ConfigError(f"an image's tokens have {k} newline(s) beside them where Gemma 3's processor puts two; "
                          "these ids were not expanded by its processor")
    out, k = [], k - 2
    while k > 0:
        n = min(k, len(newline_ids))
        out.append(int(newline_ids[n - 1]))
        k -= n
    return out
