"""The OpenAI-compatible endpoint that lets any agent program drive the policy, and records what it trains on.
May import core, rollout, rewards and data (docs/architecture.md); FastAPI and uvicorn (serve extra),
openai (agents extra)."""

from rlhfkit.agents.endpoint.episodes import EndpointLimits
from rlhfkit.agents.endpoint.handlers import Settings
from rlhfkit.agents.endpoint.runner import EndpointExecutor
from rlhfkit.agents.endpoint.segments import Call, stitch
from rlhfkit.agents.endpoint.server import EndpointServer

__all__ = ["Call", "EndpointExecutor", "EndpointLimits", "EndpointServer", "Settings", "stitch"]
