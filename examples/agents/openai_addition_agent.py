"""A multi-turn agent written only against the OpenAI API, for `rlhfkit train rl --agent.func_path`.

It asks the model a sum, checks the reply with its own code (the first number in the reply), tells
the model whether it was right and, when it was not, asks again once. Reward: 1 for the right number
on the first try, 0.5 on the second, else 0. Nothing here names rlhfkit: `client` is an
`openai.AsyncOpenAI` pointed at the policy. Dataset rows: {"prompt": "What is 3 + 4?", "label": "7"}.
"""

import re


def first_number(text: str) -> str | None:
    found = re.search(r"-?\d+", text)
    return found.group() if found else None


async def agent(client, prompt, label, **row):
    messages = [{"role": "user", "content": f"{prompt} Reply with only the number."}]
    for attempt in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=12)
        text = reply.choices[0].message.content or ""
        if first_number(text) == str(label):
            return {"reward": 1.0 if attempt == 0 else 0.5, "extra_logs": {"first_try": float(attempt == 0)}}
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": "No, that is not right. "
                                                    "Add the two numbers again. Reply with only the number."})
    return {"reward": 0.0, "extra_logs": {"first_try": 0.0}}
