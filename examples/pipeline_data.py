"""Write the small synthetic data of the SFT -> RM -> PPO pipeline in docs/sft_rm_dpo.md.

Task: answer "What is a + b?". The SFT data answers half the time as "Sure! a + b = c." and half
the time as "a + b = c."; the preference pairs (and the KTO labels) prefer the "Sure!" answer;
PPO against the reward model then pushes the policy towards it. Fixed seed, no network.

    python examples/pipeline_data.py data/pipeline
"""

import json
import random
import sys
from pathlib import Path


def main(out: str) -> None:
    rng = random.Random(0)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    problems = [(rng.randint(1, 20), rng.randint(1, 20)) for _ in range(192)]
    ask = lambda a, b: f"What is {a} + {b}?"  # noqa: E731
    plain = lambda a, b: f"{a} + {b} = {a + b}."  # noqa: E731
    sure = lambda a, b: f"Sure! {a} + {b} = {a + b}."  # noqa: E731
    sft = [{"messages": [{"role": "user", "content": ask(a, b)},
                         {"role": "assistant", "content": (sure if i % 2 else plain)(a, b)}]}
           for i, (a, b) in enumerate(problems[:64])]
    pairs = [{"prompt": ask(a, b), "chosen": sure(a, b), "rejected": plain(a, b)} for a, b in problems[64:128]]
    prompts = [{"prompt": ask(a, b), "answer": str(a + b)} for a, b in problems[128:]]
    kto = [{"prompt": ask(a, b), "output": (sure if i % 2 else plain)(a, b), "label": bool(i % 2)}
           for i, (a, b) in enumerate(problems[64:128])]
    for name, rows in [("sft.jsonl", sft), ("pairs.jsonl", pairs), ("prompts.jsonl", prompts), ("kto.jsonl", kto)]:
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(sft)} SFT conversations, {len(pairs)} preference pairs, {len(prompts)} RL prompts "
          f"and {len(kto)} KTO examples to {root}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/pipeline")
