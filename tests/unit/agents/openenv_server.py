"""A real OpenEnv environment server on 127.0.0.1 for the tests (openenv-core installed): `GuessEnv`, say the
row's seed's digit in three tries, served by openenv's own `create_app` under uvicorn in a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


def guess_env_classes():
    """(GuessEnv, GuessAction, GuessObservation): an OpenEnv Environment with its typed action and observation."""
    from openenv.core.env_server import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class GuessAction(Action):
        message: str

    class GuessObservation(Observation):
        prompt: str = ""

    class GuessEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.target, self.tries = (seed or 0) % 10, 0
            return GuessObservation(prompt="Guess my digit.")

        def step(self, action, timeout_s=None, **kwargs):
            self.tries += 1
            said = action.message.strip()
            right = said == str(self.target)
            return GuessObservation(prompt="yes" if right else f"not {said}", reward=1.0 if right else 0.0,
                                    done=right or self.tries >= 3)

        @property
        def state(self):
            return State(step_count=self.tries)

    return GuessEnv, GuessAction, GuessObservation


@contextlib.contextmanager
def guess_server(max_sessions: int = 8):
    """Serves GuessEnv on a free local port; yields its URL."""
    import uvicorn
    from openenv.core.env_server import create_app

    env, action, observation = guess_env_classes()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = create_app(env, action, observation, env_name="guess", max_concurrent_envs=max_sessions)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
