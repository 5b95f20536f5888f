"""One chat or text completion, from the request body to the reply, token-in token-out.

The prompt's token ids: a chat request that continues an earlier call of its episode (the same
messages, then the reply the endpoint gave, then new messages) gets that call's prompt ids + the
ids the engine sampled + the tokens the chat template puts after an assistant turn for the new
messages (`ToolTemplate.delta`): the sampled tokens are never re-tokenized, and the episode stays
one trajectory. Any other chat request is rendered through the chat template (with its `tools`)
and tokenized. A text prompt that starts with an earlier prompt + its sampled text likewise reuses
those ids; a prompt given as token ids is used as it is.

With a vision-language policy (`Settings.processor`) chat messages may hold image_url parts
(vision.py): the processor's chat template renders them (with the request's `tools`, as for a text
policy; tool calls are parsed from the reply alike), the call's image tensors go to the engine with
its prompt and are recorded with it; a continuing call gets the new messages' tokens and images
after the earlier call's. Text prompts may not hold the model's image tokens, tool messages no images.

`tool_choice` "required" or a named function appends the opening of a call to the prompt ids (they are
the prompt's: recorded as context, masked in training, not in the reply's `token_ids`; the reply's text and
tool calls are read from it and the sampled tokens together); `parallel_tool_calls` false cuts a sample
that opens a second call after the token that completes its first (toolchoice.py).

`response_format` json_object / json_schema (wire.py) hands the engine a constraint with the prompt: the
whole reply is sampled under its grammar (rollout/constrained.py), in training as in `rlhfkit serve`.

Sampling: with `honor_sampling` False (training) the run's temperature, top_p and top_k are used
whatever the request asks, so the recorded logprobs are the ones the trainer computes; `n`,
`max_tokens` (within the budgets) and `stop` are the request's; a request's `seed` is used by
`rlhfkit serve` only (an episode's calls are seeded from the episode's seed). `stop` strings cut the sampled
tokens after the token that completes the string (rollout/stops.py); the reply's text stops before it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from jinja2 import TemplateError

from rlhfkit.agents.endpoint import toolchoice
from rlhfkit.agents.endpoint.episodes import SERVE_ID, Episode, Registry, Turn, room
from rlhfkit.agents.endpoint.segments import Call
from rlhfkit.agents.endpoint.vision import ImageParts, RefusedImage, VisionTemplate
from rlhfkit.agents.endpoint.wire import (
    BadRequest,
    Choice,
    Sampling,
    completion_body,
    normal,
    sampling,
    template_messages,
    tool_call_entries,
)
from rlhfkit.agents.tools.render import ToolTemplate
from rlhfkit.data.types import FINISH_LENGTH, FINISH_STOP, Trajectory
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.stops import stop_position

Generate = Callable[[list[int], SamplingParams, int, object, Any, Any], Awaitable[list[Trajectory]]]
Gone = Callable[[], Awaitable[bool]]  # whether the client went away (closed its connection) while its call sampled


def _function_tool(tool: Any) -> bool:
    """Whether `tool` is of OpenAI's function tool form: {type: function, function: {name, parameters, ...}}
    (parameters, when given, a JSON schema object: the chat template reads its fields)."""
    function = tool.get("function") if isinstance(tool, dict) else None
    return (isinstance(function, dict) and isinstance(function.get("name"), str)
            and isinstance(function.get("parameters") or {}, dict))


@dataclass
class Settings:
    """What the endpoint samples with: the run's `params` (temperature, top_p, top_k, stop ids),
    whether a request's own temperature/top_p/top_k win (`honor_sampling`), the tool-call parser,
    the model name replies carry; a vision-language policy's processor (chat messages may then hold
    image_url parts, vision.py) and the most distinct images an episode may send (None: any), with the
    flag that sets it (named in refusals)."""

    params: SamplingParams
    honor_sampling: bool = False
    tool_parser: str | None = None
    model_name: str = "policy"
    processor: Any = None
    max_images: int | None = None
    images_flag: str = "--data.max_images_per_prompt"


class Completions:
    """Serves chat and text completions for episodes over `generate(ids, params, seed, episode, vision)`."""

    def __init__(self, tokenizer, settings: Settings, registry: Registry, generate: Generate):
        self.tokenizer, self.settings, self.registry, self.generate = tokenizer, settings, registry, generate
        self.vision = VisionTemplate(settings.processor) if settings.processor is not None else None
        self._templates: dict[str, ToolTemplate] = {}

    def template(self, tools: Any) -> ToolTemplate:
        """The chat template with these tools (rendered by a vision-language policy's processor)."""
        if tools is not None and not (isinstance(tools, list) and all(_function_tool(t) for t in tools)):
            raise BadRequest("tools: give a list of {type: function, function: {name, description, parameters}} "
                             "objects")
        key = json.dumps(tools or [], sort_keys=True)
        if key not in self._templates:
            self._templates[key] = ToolTemplate(self.tokenizer, tools or (), self.settings.tool_parser,
                                                renderer=self.settings.processor)
        return self._templates[key]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ chat
    async def chat(self, e: Episode, body: dict, gone: Gone | None = None) -> dict:
        ask = sampling(body, chat=True)
        try:
            tt = self.template(body.get("tools"))
            wants = toolchoice.read(body)
            if ask.constraint is not None:  # the reply is the format's JSON: it holds no call (Llama 3's are JSON)
                if wants.force:
                    raise BadRequest("response_format: a JSON reply cannot hold the call tool_choice forces; send "
                                     "one of them")
                wants = replace(wants, parse=False)
            forced = toolchoice.forced_text(tt, wants)
            if self.vision is None:
                ids, normed = self.text_prompt(e, tt, body)
                images, vision = (), None
            else:
                ids, normed, images, vision = self.vision_prompt(e, tt, body)
        except TemplateError as exc:  # the template's raise_exception (roles that must alternate, ...): as vLLM, a 400
            raise BadRequest(f"messages: the chat template refused them: {exc}") from exc
        head = self.encode(forced) if forced else []
        ids = ids + head  # prompt tokens: never trained, not in the reply's
        samples = await self.sample(e, ids, ask, vision)
        if wants.parse and not wants.parallel:
            samples = [self.first_call(s, tt, forced) for s in samples]
        choices = [self.choice(tokens, lps, finish, ask, tt if wants.parse else None, head, wants.parallel)
                   for tokens, lps, finish, _ in samples]
        replies = [normal({"role": "assistant", "content": c.text, "tool_calls": [
            {"function": {"name": t["function"]["name"], "arguments": json.loads(t["function"]["arguments"])}}
            for t in c.tool_calls or ()]}) for c in choices]
        turn = Turn(normed, replies, ids, [c.token_ids for c in choices],
                    [c.finish_reason != FINISH_LENGTH and self.ends_on_stop_id(c.token_ids) for c in choices],
                    images, vision)
        await self.forget_if_gone(e, gone)
        self.keep(e, ids, choices, [s[3] for s in samples], turn=turn)
        return completion_body(True, self.settings.model_name, ids, choices, ask.logprobs)

    def continued(self, e: Episode, normed: list[tuple]) -> tuple[Turn, list[int], bool, int] | None:
        """For a request that continues one of the episode's earlier chat calls (its messages, then
        the reply the endpoint gave, then new ones): (that call's turn, the reply's sampled ids,
        whether sampling stopped on a stop token, where the new messages start); else None."""
        for turn in reversed(e.turns):
            k = len(turn.messages)
            if len(normed) <= k + 1 or normed[:k] != turn.messages:
                continue
            for c, reply in enumerate(turn.replies):
                if normed[k] == reply:
                    return turn, turn.sampled[c], turn.stopped[c], k + 1
        return None

    def text_prompt(self, e: Episode, tt: ToolTemplate, body: dict) -> tuple[list[int], list[tuple]]:
        """A text policy's chat prompt: (ids, normalised messages), rendered by the chat template or
        continuing an earlier call."""
        messages = template_messages(body.get("messages"))
        normed = [normal(m) for m in messages]
        found = self.continued(e, normed)
        if found is None:
            return tt.prompt_ids(messages), normed
        turn, sampled, stopped, start = found
        return turn.prompt_ids + sampled + tt.delta(sampled, stopped, messages[start:]), normed

    def vision_prompt(self, e: Episode, tt: ToolTemplate,
                      body: dict) -> tuple[list[int], list[tuple], tuple[str, ...], Any]:
        """A vision-language policy's chat prompt: (ids, normalised messages, image keys, VisionInputs
        or None), rendered by the processor with the tools of `tt`, or continuing an earlier call with the
        new images after its own."""
        parts = ImageParts(placeholders=self.vision.placeholder_texts)
        try:
            messages = template_messages(body.get("messages"), parts.content)
        except RefusedImage as exc:
            raise self.registry.refuse(e, 400, exc.counter, str(exc)) from exc
        if any(m["role"] == "tool" and isinstance(m["content"], list) for m in messages):
            raise BadRequest("messages: a tool message holds images; tool results are text, send images in a "
                             "user message")
        self.registry.take_images(e, parts.keys, self.settings.max_images, self.settings.images_flag)
        normed = [normal(m) for m in messages]
        found = self.continued(e, normed)
        if found is None:
            ids, vision = self.vision.prompt(tt, messages, parts.images)
        else:
            turn, sampled, stopped, start = found
            delta, vision = self.vision.delta(tt, sampled, stopped, messages[start:],
                                              parts.images[len(turn.images):], turn.vision)
            ids = turn.prompt_ids + sampled + delta
        return ids, normed, tuple(parts.keys), vision

    def ends_on_stop_id(self, ids: list[int]) -> bool:
        stops = set(self.settings.params.stop_token_ids) | {self.tokenizer.eos_token_id}
        return bool(ids) and ids[-1] in stops

    # ------------------------------------------------------------------ text
    async def text(self, e: Episode, body: dict, gone: Gone | None = None) -> dict:
        ask = sampling(body, chat=False)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            ids = self.text_ids(e, prompt)
        elif (isinstance(prompt, list) and prompt
              and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            if not all(0 <= t < len(self.tokenizer) for t in prompt):
                raise BadRequest(f"prompt: token ids must be in [0, {len(self.tokenizer)})")
            ids = list(prompt)
        else:
            raise BadRequest("prompt: give one non-empty string or one list of token ids")
        if self.vision is not None and set(ids) & self.vision.placeholder_ids:
            raise BadRequest("prompt: holds the model's image token; send images as image_url parts of chat messages")
        samples = await self.sample(e, ids, ask)
        choices = [self.choice(tokens, lps, finish, ask, None) for tokens, lps, finish, _ in samples]
        prefix = self.tokenizer.decode(ids, skip_special_tokens=False)
        texts = [(prefix + self.tokenizer.decode(c.token_ids, skip_special_tokens=False), ids + c.token_ids)
                 for c in choices]
        await self.forget_if_gone(e, gone)
        self.keep(e, ids, choices, [s[3] for s in samples], texts=texts)
        return completion_body(False, self.settings.model_name, ids, choices, ask.logprobs)

    def text_ids(self, e: Episode, prompt: str) -> list[int]:
        best: tuple[str, list[int]] | None = None
        for text, ids in e.texts:
            if prompt.startswith(text) and (best is None or len(text) > len(best[0])):
                best = (text, ids)
        if best is None:
            return self.encode(prompt)
        rest = prompt[len(best[0]):]
        return best[1] + (self.encode(rest) if rest else [])

    # ------------------------------------------------------------------ sampling and recording
    async def sample(self, e: Episode, ids: list[int], ask: Sampling,
                     vision: Any = None) -> list[tuple[list[int], list[float], str, int]]:
        """(tokens, logprobs, finish reason, version) of each of the `ask.n` samples (`vision`: the
        prompt's image tensors, for a vision engine)."""
        new = room(e, len(ids), ask.max_tokens, self.registry, ask.n)
        run = self.settings.params
        own = self.settings.honor_sampling
        params = SamplingParams(
            max_new_tokens=new, n=ask.n, stop_token_ids=run.stop_token_ids,
            temperature=ask.temperature if own and ask.temperature is not None else run.temperature,
            top_p=ask.top_p if own and ask.top_p is not None else run.top_p,
            top_k=ask.top_k if own and ask.top_k is not None else run.top_k)
        # `rlhfkit serve` samples a request's own seed as vLLM does; an episode's calls keep the episode's seeds
        # (a fixed seed in an agent would make all of a prompt's episodes alike)
        seed = ask.seed if e.id == SERVE_ID and ask.seed is not None else e.next_seed()
        with self.registry.in_engine(e):
            trajs = await self.generate(ids, params, seed, e, vision, ask.constraint)
        out = []
        for t in trajs:
            tokens, lps, finish = t.response_ids.tolist(), t.logprobs.tolist(), t.finish_reason
            k = stop_position(tokens, ask.stop, self.tokenizer)
            if k is not None:
                tokens, lps, finish = tokens[:k], lps[:k], FINISH_STOP
            out.append((tokens, lps, finish, t.version))
        return out

    def first_call(self, sample: tuple, tt: ToolTemplate, forced: str) -> tuple:
        """A sample (tokens, logprobs, finish, version) cut after its first tool call (parallel_tool_calls false)."""
        tokens, lps, finish, version = sample
        k = toolchoice.first_call_end(tokens, self.tokenizer, tt, forced)
        return sample if k is None else (tokens[:k], lps[:k], FINISH_STOP, version)

    def choice(self, tokens: list[int], lps: list[float], finish: str, ask: Sampling,
               tt: ToolTemplate | None, forced: Sequence[int] = (), parallel: bool = True) -> Choice:
        """One sample as the reply shows it; `forced`: the ids of a forced call's opening before the sampled
        tokens (tool_choice), read with them; `parallel` False: the first call alone."""
        ids = list(forced) + tokens
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        start = len(self.tokenizer.decode(list(forced), skip_special_tokens=True)) if forced else 0
        for s in ask.stop:  # in the sampled text, as the tokens were cut (the forced opening is the prompt's)
            k = text.find(s, start)
            if k >= 0:
                text = text[:k]
        calls = None
        if tt is not None:
            content, parsed, _errors = tt.parse(ids)
            if parsed:
                text, calls = content, tool_call_entries(parsed if parallel else parsed[:1])
        pieces = [self.tokenizer.decode([t], skip_special_tokens=False) for t in tokens] if ask.logprobs else []
        reason = "tool_calls" if calls else finish
        return Choice(text, tokens, lps, pieces, reason, calls)

    async def forget_if_gone(self, e: Episode, gone: Gone | None) -> None:
        """Keep nothing of a call whose client went away while it sampled (a cancelled or timed-out request,
        that the agent may send again): the agent never saw its reply, so it would train as a segment of its
        own (a split). `Refused` (499, nobody reads it) when gone."""
        if gone is not None and await gone():
            raise self.registry.refuse(e, 499, "discarded_client_gone", f"the client of episode {e.id} closed "
                                       "its connection while its call was sampled; nothing of it was kept")

    def keep(self, e: Episode, ids: list[int], choices: list[Choice], versions: list[int], turn: Turn | None = None,
             texts: list[tuple[str, list[int]]] | None = None) -> None:
        images, vision = (turn.images, turn.vision) if turn is not None else ((), None)
        calls = [Call(list(ids), c.token_ids, c.logprobs, v, FINISH_LENGTH if c.finish_reason == FINISH_LENGTH
                      else FINISH_STOP, images, vision) for c, v in zip(choices, versions)]
        if not self.registry.record(e, calls, turn, texts):
            raise self.registry.refuse(e, 410, "refused_ended", f"episode {e.id} ended while its call was sampled; "
                                       "nothing of it was kept")

