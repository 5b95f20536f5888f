"""A smolagents `ToolCallingAgent` over `OpenAIServerModel`, for `rlhfkit train rl --agent.func_path`.

smolagents is synchronous: the agent runs in a worker thread (`asyncio.to_thread`) so the other episodes'
calls go on. Its model points at the episode's base URL with the episode's key. Reward: 1 when the final
answer holds the label. Rows: {"prompt": "What is 3 + 4?", "label": "7"}.
"""

import asyncio

from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


def solve(base_url: str, key: str, prompt: str) -> str:
    model = OpenAIServerModel(model_id="policy", api_base=base_url, api_key=key, max_tokens=48)
    bot = ToolCallingAgent(tools=[add], model=model, max_steps=2, verbosity_level=0)
    return str(bot.run(prompt))


async def agent(client, prompt, label, **row):
    answer = await asyncio.to_thread(solve, str(client.base_url), client.api_key, prompt)
    return 1.0 if str(label) in answer else 0.0
