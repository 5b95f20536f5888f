"""Text environments as chat episodes: gymnasium-style classes, GEM and TextArena.

One protocol (`TextEnv`) that the tool-calling executor drives, with the model's turns and the
environment's observations rendered by the chat template:

    reset(row, messages) -> the first observation (text), appended to the prompt's last user turn,
                            or the prompt itself (a list of chat messages)
    step(action)         -> (observation, reward, done): the model's turn in, the next user turn
                            (text) or the next messages (a list) out

Adapters, each a `TextEnvFactory` (one new environment per episode):

  text_env(factory)     any gymnasium-style text environment: `reset(seed=None)` returning an
                        observation or (observation, info); `step(action)` returning (observation,
                        reward, terminated, truncated, info) (or gym's 4-tuple)
  gem_env(env_id)       GEM (`pip install gem-llm`; Liu et al. 2025, "GEM: A Gym for Agentic
                        LLMs"): `gem.make(env_id)`, a gymnasium-style environment
  textarena_env(env_id) TextArena (`pip install textarena`; Guertler et al. 2025): a one-player
                        game of `ta.make(env_id + "-raw")`; each user turn holds the game's new
                        messages, the reward is the player's at `close()`
  skyrl_env(env_id)     SkyRL-Gym (`pip install skyrl-gym`): a `BaseTextEnv` made per episode as
                        SkyRL's generator makes it, `skyrl_gym.make(env_id, env_config=,
                        extras=the row)`; `init(prompt messages)` gives the prompt, `step(action)`
                        a dict whose `observations` are chat messages (see `SkyRLTextEnv`)
  skyrl_class_env(cls)  a `BaseTextEnv` subclass of the user's, made the same way
  openenv_env(url)      OpenEnv (`pip install openenv-core`): a running server's session per episode,
                        through its client's `reset` / `step` (see `OpenEnvTextEnv`)

The row's `seed` column (else an integer label) seeds `reset`, so a held-out set of seeds is
the same episodes every time; rows without one get the library's own randomness. Rewards are
summed over the episode; `terminated or truncated` ends it. The action is the turn's text as the
model wrote it (special tokens dropped). Sync or async `reset` / `step` both work.

Departure from OpenRLHF's GEM example (`agent_func_gem_multiturn.py`), which writes Qwen's turn
markers around each observation by hand: here the chat template renders them, so any chat model
works, and only the new tokens are appended (never a re-tokenized history).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlhfkit.errors import ConfigError, RewardError, first_line, one_line

log = logging.getLogger("rlhfkit")


async def _call(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


async def close_quietly(envs: Iterable[Any]) -> None:
    """Close each text environment of `envs` after a rollout stopped early (an error, a cancellation), so no
    session or process outlives it; a close() that raises is logged, not raised: the error that stopped the
    rollout is the one reported."""
    for env in envs:
        try:
            await env.close()
        except Exception as exc:  # noqa: BLE001 - the user's environment; the abort's own error goes on
            what = first_line(exc) if isinstance(exc, RewardError) else (
                f"environment {getattr(env, 'name', env)}: close() raised {type(exc).__name__}: {first_line(exc)}")
            log.warning("after the rollout stopped: %s", what)


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

    async def reset(self, row: Mapping | None, messages: list[dict] | None = None) -> str | list[dict]:
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

    async def close(self) -> None:
        """Called once the episode is over (done or cut); the library's environment needs nothing here."""

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

    async def reset(self, row: Mapping | None, messages: list[dict] | None = None) -> str | list[dict]:
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


class SkyRLTextEnv(GymTextEnv):
    """The `TextEnv` protocol over a SkyRL-Gym `BaseTextEnv`; `env` is a function of the row making it.

    As SkyRL's generator runs one: the environment is made per episode with the row's columns (but
    `prompt` and `env_class`) as its `extras` (where SkyRL's datasets keep `reward_spec`, `extra_info`, ...);
    `init(prompt)` gets the prompt's messages and returns the ones the model sees first; `step(action)`
    returns {"observations": [messages], "reward", "done", "metadata"}, its observations rendered by
    the chat template and its rewards summed; `close()` runs when the episode is over (done or cut).
    Departures: a `postprocessed_action` is not applied (training keeps the tokens the model sampled),
    and an empty observation list ends the episode (there is no new turn to render).
    """

    def __init__(self, make: Callable[[dict], Any], name: str):
        super().__init__(None, name)
        self.make = make

    async def reset(self, row: Mapping | None, messages: list[dict] | None = None) -> str | list[dict]:
        extras = {k: v for k, v in (row or {}).items() if k not in ("prompt", "env_class")}
        self.env = await self._guard("__init__", self.make, extras)
        out = await self._guard("init", self.env.init, [dict(m) for m in messages or []])
        return self._messages(out[0] if isinstance(out, tuple) else out, "init")

    async def step(self, action: str) -> tuple[str | list[dict], float, bool]:
        out = await self._guard("step", self.env.step, action)
        if not isinstance(out, Mapping) or "reward" not in out or "done" not in out:
            raise RewardError(f"environment {self.name}: step() must return a dict with observations, reward and "
                              f"done (BaseTextEnvStepOutput), got {type(out).__name__}")
        obs = self._messages(out.get("observations") or [], "step")
        return obs, _reward(out["reward"], self.name), bool(out["done"])

    async def close(self) -> None:
        if self.env is not None:
            env, self.env = self.env, None
            await self._guard("close", env.close)

    def _messages(self, obs: Any, method: str) -> list[dict]:
        if not isinstance(obs, (list, tuple)) or not all(
                isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in obs):
            raise RewardError(f"environment {self.name}: {method}() must give a list of chat messages "
                              f"({{'role': ..., 'content': str}}), got {type(obs).__name__}")
        return [dict(m) for m in obs]


OBSERVATION_TEXT_FIELDS = ("prompt", "message", "echoed_message", "text")
"""The observation fields an OpenEnv text environment's turn is read from, the first that holds text."""


class OpenEnvTextEnv(GymTextEnv):
    """The `TextEnv` protocol over an OpenEnv client (`EnvClient`: async `reset`, `step`, `close` over the
    server's websocket), one client (one server session) per episode.

    `reset(seed=)` with the row's seed; each action is `action(text)` (default `{"message": text}`, the
    field of OpenEnv's text environments, for `GenericEnvClient`); each turn's text is
    `observation(obs)` (default: the first of `OBSERVATION_TEXT_FIELDS` that holds a str); the step's
    `reward` (None counts 0) and `done` are the result's. The session is closed when the episode is over.
    """

    def __init__(self, env: Any, name: str, action: Callable[[str], Any] | None = None,
                 observation: Callable[[Any], str] | None = None):
        super().__init__(env, name)
        self.action = action or (lambda text: {"message": text})
        self.observation = observation or self._default_text

    async def reset(self, row: Mapping | None, messages: list[dict] | None = None) -> str | list[dict]:
        seed = row_seed(row)
        result = await self._guard("reset", self.env.reset, **({"seed": seed} if seed is not None else {}))
        return self._text(self.observation(result.observation), "reset")

    async def step(self, action: str) -> tuple[str, float, bool]:
        result = await self._guard("step", self.env.step, self.action(action))
        reward = 0.0 if result.reward is None else _reward(result.reward, self.name)
        return self._text(self.observation(result.observation), "step"), reward, bool(result.done)

    async def close(self) -> None:
        await self._guard("close", self.env.close)

    def _default_text(self, obs: Any) -> str:
        fields = obs if isinstance(obs, Mapping) else getattr(obs, "__dict__", {})
        for key in OBSERVATION_TEXT_FIELDS:
            if isinstance(fields.get(key), str):
                return fields[key]
        raise RewardError(f"environment {self.name}: its observation has none of the text fields "
                          f"{', '.join(OBSERVATION_TEXT_FIELDS)} (it has {', '.join(map(str, fields)) or 'none'}); "
                          "give openenv_env(..., observation=FUNCTION) from Python")


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
    wrap: Callable[[Any, str], GymTextEnv] = GymTextEnv

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


def skyrl_env(env_id: str, env_config: Mapping | None = None) -> TextEnvFactory:
    """SkyRL-Gym's registered `env_id` (e.g. "gsm8k"); `env_config` is its `environment.skyrl_gym.<env_id>`
    section of SkyRL's config (e.g. a database path), given as a dict."""
    skyrl_gym = _library("skyrl_gym", "skyrl-gym", "skyrl")
    _check_id(env_id, "skyrl", lambda: list(skyrl_gym.registry))
    config = _env_config(env_config)

    def make() -> Callable[[dict], Any]:
        return lambda extras: skyrl_gym.make(env_id, env_config=config, extras=extras)

    return TextEnvFactory(make, f"skyrl:{env_id}", SkyRLTextEnv)


def skyrl_class_env(cls: type, name: str, env_config: Mapping | None = None) -> TextEnvFactory:
    """A user's `BaseTextEnv` subclass, made per episode with the `env_config` and `extras` its
    constructor takes (by name), as `skyrl_gym.make` makes a registered one."""
    config = _env_config(env_config)
    params = inspect.signature(cls).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def build(extras: dict) -> Any:
        given = {"env_config": config, "extras": extras}
        return cls(**{k: v for k, v in given.items() if takes_all or k in params})

    return TextEnvFactory(lambda: build, name, SkyRLTextEnv)


def is_skyrl_class(obj: Any) -> bool:
    """True for a subclass of SkyRL-Gym's `Env` (a `BaseTextEnv`), told by its bases' modules so that
    skyrl_gym is not imported for other classes."""
    return inspect.isclass(obj) and any(c.__module__.split(".")[0] == "skyrl_gym" for c in obj.__mro__[1:])


def openenv_env(client: str | Callable[[], Any], action: Callable[[str], Any] | None = None,
                observation: Callable[[Any], str] | None = None) -> TextEnvFactory:
    """An OpenEnv environment: `client` is a running server's URL (local, a container or a Space; driven by
    `GenericEnvClient`) or a function making a typed client (e.g. `lambda: EchoEnv(base_url=URL)`);
    `action` and `observation` map text to the env's action and its observation to text
    (`OpenEnvTextEnv`)."""
    core = _library("openenv.core", "openenv-core", "openenv")
    make = (lambda: core.GenericEnvClient(base_url=client)) if isinstance(client, str) else client
    name = f"openenv:{client}" if isinstance(client, str) else getattr(client, "__qualname__", "openenv")
    return TextEnvFactory(make, name, functools.partial(OpenEnvTextEnv, action=action, observation=observation))


def _env_config(env_config: Mapping | None) -> Any:
    """SkyRL's environments read their config as an omegaconf DictConfig (attribute access)."""
    from omegaconf import OmegaConf

    return OmegaConf.create(dict(env_config or {}))


LIBRARIES: dict[str, Callable[[str], TextEnvFactory]] = {"gem": gem_env, "textarena": textarena_env,
                                                         "skyrl": skyrl_env, "openenv": openenv_env}
"""`--agent.env LIBRARY:ENV_ID` adapters."""


def load_text_env(spec: str) -> TextEnvFactory:
    """`--agent.env SPEC`: LIBRARY:ENV_ID (`LIBRARIES`), or FILE_OR_MODULE:NAME of a gymnasium-style
    class (or a function making one) or of a SkyRL-Gym `BaseTextEnv` subclass."""
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
    if is_skyrl_class(factory):
        return skyrl_class_env(factory, f"{source}:{name}")
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
