"""GenerationEngines for tests: one that answers from a script (a function of the decoded context), and
a vision engine whose first call writes a given action (a tool call) with the model's own logprobs."""

import pytest
import torch

from rlhfkit.data.batch import collate
from rlhfkit.data.types import FINISH_LENGTH, FINISH_STOP, Trajectory
from rlhfkit.models.logprobs import response_logprobs


class ScriptedEngine:
    """`policy(context_text) -> action text`; actions are tokenized, cut at max_new_tokens, logprob -0.5."""

    def __init__(self, tokenizer, policy):
        self.tokenizer, self.policy = tokenizer, policy
        self.calls: list[tuple[list[list[int]], object]] = []
        self.seeds: list[list[int] | None] = []  # the seeds of each call
        self._version = 3

    @property
    def version(self) -> int:
        return self._version

    def update_weights(self, state, version):
        self._version = version

    def generate(self, prompts, params, generator=None, group_ids=None, seeds=None):
        self.calls.append(([list(p) for p in prompts], params))
        self.seeds.append(None if seeds is None else list(seeds))
        out = []
        for i, p in enumerate(prompts):
            for _ in range(params.n):
                text = self.policy(self.tokenizer.decode(list(p), skip_special_tokens=False))
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                stopped = len(ids) <= params.max_new_tokens
                ids = ids[: params.max_new_tokens]
                out.append(Trajectory(
                    prompt_ids=torch.tensor(list(p)), response_ids=torch.tensor(ids, dtype=torch.long),
                    loss_mask=torch.ones(len(ids), dtype=torch.bool), logprobs=torch.full((len(ids),), -0.5),
                    finish_reason=FINISH_STOP if stopped else FINISH_LENGTH, version=self._version,
                    group_id=group_ids[i] if group_ids is not None else i,
                ))
        return out


class FirstTurnCalls:
    """A VisionEngine whose first call writes `call_ids` and stops (teacher-forced: its logprobs are the
    model's over them with the prompt's images); later calls sample, without the image tensors when
    `drop_images`."""

    def __init__(self, engine, call_ids: list[int], pad_id: int, drop_images: bool = False):
        self.engine, self.call_ids, self.drop_images, self.calls = engine, call_ids, drop_images, []
        self.pad_id = pad_id
        self.banned_ids, self.version = engine.banned_ids, engine.version

    def generate(self, prompts, params, generator=None, group_ids=None, seeds=None, vision=None):
        self.calls.append(vision)
        if len(self.calls) > 1:
            return self.engine.generate(prompts, params, generator, seeds=seeds,
                                        vision=None if self.drop_images else vision)
        n = len(self.call_ids)
        out = [Trajectory(torch.tensor(p), torch.tensor(self.call_ids), torch.ones(n, dtype=torch.bool),
                          torch.zeros(n), "stop", self.version, info={} if vision is None else {"vision": vision[k]})
               for k, p in enumerate(prompts)]
        with torch.no_grad():
            logp, _ = response_logprobs(self.engine.model, collate(out, self.pad_id),
                                        temperature=params.temperature)
        for t, row in zip(out, logp):
            t.logprobs = row[:n].clone()
        return out


def forward_gap(model, proc, trajs) -> torch.Tensor:
    """|rollout logprob - trainer's forward logprob| of every action token [N] (a vision-language
    model's forward takes each trajectory's images from info["vision"])."""
    padded = collate(trajs, proc.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = response_logprobs(model, padded, temperature=1.0)
    rollout = torch.zeros_like(logp)
    for i, t in enumerate(trajs):
        rollout[i, : t.response_length] = t.logprobs
    return (logp - rollout)[padded.loss_mask].abs()


@pytest.fixture
def scripted():
    return ScriptedEngine


@pytest.fixture(scope="session")
def tok():
    from rlhfkit.models.tiny import tiny_tokenizer

    return tiny_tokenizer()


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def char_tokenizer(chat_template: str = CHATML, specials: tuple[str, ...] = ("<|im_start|>", "<|im_end|>")):
    """One token per printable character plus `specials` as single tokens (eos: the second one,
    or the first); every text has exactly one tokenization, so only real re-renders break a prefix."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                                  chat_template=chat_template)
    tok.add_special_tokens({"additional_special_tokens": list(specials)})
    tok.eos_token = specials[1] if len(specials) > 1 else specials[0]
    return tok


@pytest.fixture(scope="session")
def chat_tok():
    return char_tokenizer()


def tiny_chat_model(chat_template: str = CHATML, specials: tuple[str, ...] = ("<|im_start|>", "<|im_end|>")):
    """(model, tokenizer): a tiny 2-layer Llama (seeded weights) over `char_tokenizer(chat_template, specials)`."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.models.tiny import tiny_config

    tok = char_tokenizer(chat_template, specials)
    config = tiny_config("llama")
    config.vocab_size, config.pad_token_id, config.eos_token_id = len(tok), tok.pad_token_id, tok.eos_token_id
    config.bos_token_id = None
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config), tok


def save_tiny_chat_model(path, chat_template: str = CHATML, specials: tuple[str, ...] = ("<|im_start|>", "<|im_end|>")):
    """A tiny 2-layer Llama over `char_tokenizer(chat_template, specials)` saved as an HF folder (seeded weights)."""
    model, tok = tiny_chat_model(chat_template, specials)
    model.save_pretrained(path)
    tok.save_pretrained(path)
