"""Prime Intellect's `verifiers` environments as agents: their own rollout code runs against the endpoint.

    --agent.func_path verifiers:ENV_ID      vf.load_environment(ENV_ID) (its package installed)
    RLTrainer.from_config(cfg, agent=env)   a verifiers Environment built in Python

Each episode runs `env.run_rollout(input, client, "policy", env.sampling_args)` with `client` the
episode's `openai.AsyncOpenAI` (pointed at the endpoint, runner.py) wrapped in verifiers'
`OpenAIChatCompletionsClient`: the environment's turns, parser and tools are its own, and what trains
is what the endpoint recorded. The episode's reward is the rubric's (`output["reward"]`, its weighted
sum), each reward function's score (`output["metrics"]`) is logged as `reward_extra/NAME`, and
`reward_extra/vf_error` counts rollouts verifiers ended on an error (the model's empty reply, a
refused call); those still train with the rubric's reward, as verifiers scores them.

The rollout input of a prompt: `prompt` as messages (a string becomes the environment's system prompt,
few-shot turns and one user message; a message list gets the system prompt when it has none),
`answer` the row's label (else its `answer` column), `info` and `example_id` the row's. Without
--data.prompt_dataset the prompts are the environment's own dataset (`env.get_dataset()`), read with
--data.apply_chat_template (its prompts are message lists).

Rubrics with group reward functions (scored over all of a prompt's rollouts at once) are refused: every
episode here runs on a client of its own and is scored alone. The environments are verifiers' classic
ones (`vf.Environment`: SingleTurnEnv, MultiTurnEnv, ToolEnv, ...), not those of its `verifiers.v1` stack.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.agents.endpoint.runner import EndpointExecutor
from rlhfkit.errors import ConfigError

PREFIX = "verifiers:"
MODEL = "policy"
INSTALL = "pip install 'rlhfkit[verifiers]'"


def is_verifiers_env(obj: Any) -> bool:
    """Whether `obj` has what a verifiers Environment offers here: `run_rollout`, `rubric`, `get_dataset`."""
    return callable(getattr(obj, "run_rollout", None)) and hasattr(obj, "rubric") \
        and callable(getattr(obj, "get_dataset", None))


def load_verifiers_env(spec: str):
    """The environment of `verifiers:ENV_ID` (--agent.func_path): `vf.load_environment(ENV_ID)`."""
    env_id = spec[len(PREFIX):]
    if not env_id:
        raise ConfigError("--agent.func_path verifiers:ENV_ID: name the environment (e.g. verifiers:gsm8k)")
    vf = _verifiers()
    try:
        env = vf.load_environment(env_id)
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"--agent.func_path {spec}: {exc}") from exc
    if not is_verifiers_env(env):
        raise ConfigError(f"--agent.func_path {spec}: load_environment returned {type(env).__name__}, not a "
                          "vf.Environment (verifiers' classic API; its verifiers.v1 environments are not supported)")
    return env


def _verifiers():
    try:
        import verifiers  # noqa: PLC0415 - the verifiers extra
    except ImportError as exc:
        raise ConfigError(f"verifiers environments need the verifiers package: {INSTALL}") from exc
    return verifiers


def rollout_input(env, prompt: str | list[dict], label: Any, row: dict) -> dict:
    """The verifiers RolloutInput of one dataset row (module docstring)."""
    system = [{"role": "system", "content": env.system_prompt}] if env.system_prompt else []
    if isinstance(prompt, str):
        messages = [*system, *(env.few_shot or []), {"role": "user", "content": prompt}]
    else:
        messages = list(prompt)
        if system and not (messages and messages[0].get("role") == "system"):
            messages = system + messages
    answer = label if label is not None else row.get("answer")
    out = {"prompt": messages, "example_id": int(row.get("example_id", 0)), "info": row.get("info") or {}}
    if answer is not None:
        out["answer"] = str(answer)
    return out


def verifiers_agent(env):
    """`async def agent(client, prompt, label, **row)` running one rollout of `env` per call."""
    if env.requires_group_rollouts:
        raise ConfigError(f"verifiers environment {env.env_id or type(env).__name__}: its rubric has group reward "
                          "functions, which score all of a prompt's rollouts together; rlhfkit scores each "
                          "episode alone: use a rubric of per-rollout reward functions")
    vf = _verifiers()

    async def agent(client, prompt, label, **row):
        output = await env.run_rollout(rollout_input(env, prompt, label, row), vf.OpenAIChatCompletionsClient(client),
                                       MODEL, dict(env.sampling_args))
        logs = {str(k): float(v) for k, v in (output.get("metrics") or {}).items()}
        logs["vf_error"] = float(output.get("error") is not None)
        return {"reward": float(output["reward"]), "extra_logs": logs}

    agent.__qualname__ = f"verifiers environment {env.env_id or type(env).__name__}"
    return agent


class VerifiersExecutor(EndpointExecutor):
    """An EndpointExecutor whose episodes are `env`'s rollouts (module docstring); `options` as EndpointExecutor's."""

    def __init__(self, env, **options):
        agent = verifiers_agent(env)
        super().__init__(agent, source=agent.__qualname__, **options)
        self.env = env

    def own_dataset(self, input_key: str) -> list[dict]:
        """The environment's training rows, its `prompt` column under `input_key` (--data.input_key)."""
        rows = self.env.get_dataset().to_list()
        if input_key != "prompt":
            rows = [{input_key: r.pop("prompt"), **r} for r in rows]
        return rows
