"""An OpenAI Agents SDK agent (`openai-agents`) with a function tool, for `rlhfkit train rl --agent.func_path`.

The SDK's Chat Completions model runs on the episode's `client` (an `openai.AsyncOpenAI` already pointed at
the policy); the SDK's default model speaks the Responses API, which rlhfkit's endpoint does not serve.
Reward: 1 when the final answer holds the label. Rows: {"prompt": "What is 3 + 4?", "label": "7"}
(examples/agents/make_addition_data.py writes them).
"""

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import AgentsException

set_tracing_disabled(True)  # no trace export to OpenAI's servers


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def agent(client, prompt, label, **row):
    bot = Agent(name="calculator", instructions="Use the add tool, then reply with the number only.", tools=[add],
                model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                model_settings=ModelSettings(max_tokens=48))
    try:
        result = await Runner.run(bot, prompt, max_turns=3)
    except AgentsException:  # too many turns, a call of an unknown tool: the episode scores 0
        return 0.0
    return 1.0 if str(label) in str(result.final_output) else 0.0
