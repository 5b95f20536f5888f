"""A langchain-openai agent loop (`ChatOpenAI` with `bind_tools`, streaming), for `rlhfkit train rl
--agent.func_path`.

The model streams its replies (`streaming=True`); each tool call runs and its result goes back as a
`ToolMessage` until the model answers without one. Reward: 1 when the answer holds the label.
Rows: {"prompt": "What is 3 + 4?", "label": "7"}.
"""

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def agent(client, prompt, label, **row):
    llm = ChatOpenAI(model="policy", base_url=str(client.base_url), api_key=client.api_key, max_tokens=48,
                     streaming=True).bind_tools([add])
    messages = [HumanMessage(f"{prompt} Use the add tool, then reply with the number only.")]
    for _ in range(3):
        reply = await llm.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return 1.0 if str(label) in str(reply.content) else 0.0
        for call in reply.tool_calls:
            try:
                messages.append(await add.ainvoke(call))  # a ToolMessage with the call's id
            except Exception as exc:  # noqa: BLE001 - arguments the tool refuses: the model reads why
                messages.append(ToolMessage(f"error: {exc}", tool_call_id=call["id"]))
    return 0.0
