"""One AgentInstance episode driven through an engine with vLLM's face, as OpenRLHF's `execute` runs it.

The default `execute` of both OpenRLHF contracts (mid-2025 `AgentExecutorBase`, 2026
`MultiTurnAgentExecutor`) for agent files that override `execute` and call the base's; files
that do not override it run through `MultiTurnExecutor.run` instead (the same episode, batched
per turn). The result is OpenRLHF's result dict (see execute.py for how it becomes a Trajectory).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from rlhfkit.agents.base import check_step_result, new_instance
from rlhfkit.agents.engine_adapter import merge_vllm_params
from rlhfkit.agents.images import EpisodeImages, feedback_tokens
from rlhfkit.errors import RewardError


async def agent_episode(instance_cls: type, prompt: str, label: Any, sampling_params: Any, max_steps: int,
                        max_length: int, tokenizer, generate: Callable[..., Awaitable[Any]], source: str,
                        images: EpisodeImages | None = None, prompt_images: Any = None) -> dict:
    """Reset a new `instance_cls`, then up to `max_steps` turns of generate -> step, each action's
    tokens followed by its feedback's, while `max_length` (prompt + response tokens) leaves room.

    `generate(ids, sampling_params)` returns a vLLM-style RequestOutput. With a vision-language policy
    (`images`), the prompt is encoded with `prompt_images` by the processor, every call also gets the
    episode's images so far (`multi_modal_data`), and step()'s `environment_images` join them (feedback
    whose images do not fit loses them and ends the episode). Returns the result dict:
    observation_tokens, action_ranges, reward (summed), scores (the last step's, else the reward),
    extra_logs (the last step's), rollout_log_probs (0 on prompt and feedback), truncated (not done).
    """
    env = await new_instance(instance_cls)
    reset = await env.reset({"observation": prompt, "label": label})
    text = reset.get("observation", prompt) if isinstance(reset, Mapping) else prompt
    if prompt_images and images is None:
        raise RewardError(f"agent {source}: execute() got images, which need a vision-language policy")
    tokens = (images.prompt(text, prompt_images, source) if prompt_images
              else list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    ranges, logprobs = [], [0.0] * len(tokens)
    reward, score, logs, done, dropped = 0.0, None, {}, False, False
    for _ in range(max_steps):
        sampling_params.max_tokens = max_length - len(tokens)
        if sampling_params.max_tokens <= 0 or dropped:
            break
        out = (await generate(tokens, sampling_params, **(images.data() if images else {}))).outputs[0]
        action = list(out.token_ids)
        ranges.append((len(tokens), len(tokens) + len(action)))
        raw = await env.step({"observation_text": text, "action_text": out.text, "label": label,
                              "sampling_params": sampling_params})
        step = check_step_result(raw, source, sampling_params, merge=merge_vllm_params)
        if images is not None:
            room = max_length - len(tokens) - len(action)
            feedback, dropped = images.feedback(tokenizer, step.feedback, step.images, room, source)
        else:
            feedback = feedback_tokens(None, tokenizer, step.feedback, step.images, (), source)[0]
        tokens += action + feedback
        if logprobs is not None and out.logprobs is not None:
            logprobs += [lp[t].logprob for t, lp in zip(action, out.logprobs)] + [0.0] * len(feedback)
        else:
            logprobs = None
        text += out.text + step.feedback
        reward, score, logs, done = reward + step.reward, step.score, step.extra_logs, step.done
        sampling_params = step.sampling_params
        if done:
            break
    return {"prompt": prompt, "label": label, "observation_tokens": tokens, "action_ranges": ranges,
            "reward": reward, "scores": reward if score is None else score, "extra_logs": logs,
            "rollout_log_probs": logprobs, "truncated": not done}
