"""Text environments as chat episodes: gymnasium-style classes, GEM and TextArena.

One protocol (`TextEnv`) that the tool-calling executor drives, with the model's turns and the
environment's observations rendered by the chat template:

    reset(row)    -> the first observation (text), appended to the prompt's last user turn
    step(action)  -> (observation, reward, done): the model's turn in, the next user turn out

Adapters, each a `TextEnvFactory` (one new environment per episode):

  text_env(factory)     any gymnasium-style text environment: `reset(seed=None)` returning an
                        observation or (observation, info); `step(action)` returning (observation,
                        reward, terminated, truncated, info) (or gym's 4-tuple)
  gem_env(env_id)       GEM (`pip install gem-llm`; Liu et al. 2025, "GEM: A Gym for Agentic
                        LLMs"): `gem.make(env_id)`, a gymnasium-style environment
  textarena_env(env_id) TextArena (`pip install textarena`; Guertler et al. 2025): a one-player
                        game of `ta.make(env_id + "-raw")`; each user turn holds the game's new
                        messages, the reward is the player's at `close()`

The row's `seed` column (else an integer label) seeds `reset`, so a held-out set of seeds is
the same episodes every time; rows without one get the library's own randomness. Rewards are
summed over the episode; `terminated or truncated` ends it. The action is the turn's text as the
model wrote it (special tokens dropped). Sync or async `reset` / `step` both work.

Departure from OpenRLHF's GEM example (`agent_func_gem_multiturn.py`), which writes Qwen's turn
markers around each observation by hand: here the chat template renders them, so any chat model
works, and only the new tokens are appended (never a re-tokenized history).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlhfkit.errors import ConfigError, RewardError, first_line, one_line


async def _call(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


def row_seed(row: Mapping | None) -> int | None:
    """The episode's seed: the row's `seed`, else its `label` when that is an integer."""
    row = row or {}
    for key in ("seed", "label"):
        value = row.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit()):
            return int(value)
    return None


class GymTextEnv:
    """The `TextEnv` protocol over a gymnasium-style text environment `env` (named `name` in errors)."""

    def __init__(self, env: Any, name: str):
        self.env, self.name = env, name

    async def reset(self, row: Mapping | None) -> str:
        params = inspect.signature(self.env.reset).parameters
        takes = "seed" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        seed = row_seed(row)
        out = await self._guard("reset", self.env.reset, **({"seed": seed} if takes and seed is not None else {}))
        obs = out[0] if isinstance(out, tuple) else out
        return self._text(obs, "reset")

    async def step(self, action: str) -> tuple[str, float, bool]:
        out = await self._guard("step", self.env.step, action)
        if not isinstance(out, tuple) or len(out) not in (4, 5):
            raise RewardError(f"environment {self.name}: step() must return (observation, reward, terminated, "
                              f"truncated, info), got {type(out).__name__}")
        obs, reward, *flags, _info = out
        return self._text(obs, "step"), _reward(reward, self.name), any(bool(f) for f in flags)

    def _text(self, obs: Any, method: str) -> str:
        if obs is None:
            return ""
        if not isinstance(obs, str):
            raise RewardError(f"environment {self.name}: {method}() gave a {type(obs).__name__} observation; text "
                              "environments return a str")
        return obs

    async def _guard(self, method: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        try:
            return await _call(fn, *args, **kwargs)
        except RewardError:
            raise
        except Exception as exc:  # the user's environment, in one line
            first = first_line(exc)
            raise RewardError(f"environment {self.name}: {method}() raised {type(exc).__name__}: {first}") from exc


class TextArenaTextEnv(GymTextEnv):
    """The `TextEnv` protocol over a one-player TextArena game (its `-raw` observations)."""

    async def reset(self, row: Mapping | None) -> str:
        await self._guard("reset", self.env.reset, num_players=1, seed=row_seed(row))
        return await self._observation()

    async def step(self, action: str) -> tuple[str, float, bool]:
        done, _info = await self._guard("step", self.env.step, action)
        if not done:
            return await self._observation(), 0.0, False
        rewards, _game_info = await self._guard("close", self.env.close)
        return "", _reward((rewards or {}).get(0, 0.0), self.name), True

    async def _observation(self) -> str:
        player, messages = await self._guard("get_observation", self.env.get_observation)
        if isinstance(messages, str):
            return messages
        # (from_id, text, kind) tuples since the last call: what others said, not the player's own echo
        return "\n".join(str(m[1]) for m in messages if m[0] != player)


def _reward(value: Any, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RewardError(f"environment {name}: reward {value!r} is not a number") from None


@dataclass(frozen=True)
class TextEnvFactory:
    """Makes one `TextEnv` per episode: `make()` builds the library's environment, `wrap` adapts it."""

    make: Callable[[], Any]
    name: str
    wrap: type[GymTextEnv] = GymTextEnv

    def __call__(self) -> GymTextEnv:
        try:
            env = self.make()
        except Exception as exc:  # a bad environment id, arguments or missing data (nltk's: a blank first line)
            raise ConfigError(f"environment {self.name}: cannot create it ({one_line(exc)})") from exc
        return self.wrap(env, self.name)


def text_env(factory: Callable[[], Any], name: str | None = None) -> TextEnvFactory:
    """A gymnasium-style text environment class (or a function making one) as episodes' environment."""
    return TextEnvFactory(factory, name or getattr(factory, "__qualname__", "text environment"))


def gem_env(env_id: str, **kwargs: Any) -> TextEnvFactory:
    """GEM's `env_id` (e.g. "game:GuessTheNumber-v0-easy"); `kwargs` go to `gem.make`."""
    gem = _library("gem", "gem-llm", "gem")

    def make() -> Any:
        return gem.make(env_id, **kwargs)

    _check_id(env_id, "gem", lambda: list(getattr(gem.envs.registration, "ENV_REGISTRY", {})) or None)
    return TextEnvFactory(make, f"gem:{env_id}")


def textarena_env(env_id: str, **kwargs: Any) -> TextEnvFactory:
    """TextArena's one-player game `env_id` (e.g. "GuessTheNumber-v0"), played with raw observations."""
    ta = _library("textarena", "textarena", "textarena")
    raw = env_id if env_id.endswith("-raw") else f"{env_id}-raw"

    def make() -> Any:
        return ta.make(raw, **kwargs)

    _check_id(raw, "textarena", lambda: list(ta.envs.registration.ENV_REGISTRY))
    return TextEnvFactory(make, f"textarena:{env_id}", TextArenaTextEnv)


LIBRARIES: dict[str, Callable[[str], TextEnvFactory]] = {"gem": gem_env, "textarena": textarena_env}
"""`--agent.env LIBRARY:ENV_ID` adapters."""


def load_text_env(spec: str) -> TextEnvFactory:
    """`--agent.env SPEC`: LIBRARY:ENV_ID (`LIBRARIES`), or FILE_OR_MODULE:NAME of a gymnasium-style
    class (or a function making one)."""
    source, _, name = spec.partition(":")
    if source in LIBRARIES:
        if not name:
            raise ConfigError(f"--agent.env {spec}: name the environment, {source}:ENV_ID")
        return LIBRARIES[source](name)
    if not name:
        raise ConfigError(f"--agent.env {spec}: give LIBRARY:ENV_ID ({', '.join(LIBRARIES)}) or FILE_OR_MODULE:Class")
    import importlib
    from pathlib import Path

    from rlhfkit.rewards.loader import import_python_file

    if source.endswith(".py"):
        if not Path(source).is_file():
            raise ConfigError(f"--agent.env {source} does not exist; give a .py file or a module name")
        module = import_python_file(Path(source), "environment file")
    else:
        try:
            module = importlib.import_module(source)
        except ImportError as exc:
            raise ConfigError(f"--agent.env {source}: cannot import it ({exc}); give a .py file, an importable "
                              f"module or one of {', '.join(LIBRARIES)}") from exc
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ConfigError(f"--agent.env {source} has no class or function {name!r}")
    return text_env(factory, f"{source}:{name}")


def _library(module: str, package: str, extra: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"{module} is not installed: pip install 'rlhfkit[{extra}]' (the {package} package)") from exc


def _check_id(env_id: str, library: str, known: Callable[[], list[str] | None]) -> None:
    ids = known()
    if ids is not None and env_id not in ids:
        close = [i for i in ids if env_id.split("-")[0].lower() in i.lower()][:5]
        raise ConfigError(f"--agent.env {library}:{env_id}: no such environment"
                          + (f"; similar: {', '.join(close)}" if close else ""))
