"""`rlhfkit plan` counts a tool-calling episode's tool results in its memory estimate: responses are
the actions plus the tool results (at most the episode's token budget); values by hand."""

from rlhfkit.cli.plan_cmd import format_memory
from rlhfkit.config import RLConfig
from rlhfkit.config.plan import response_tokens
from rlhfkit.models.memory import SMOLLM2_CONFIG, GiB


def cfg_of(*flags) -> RLConfig:
    return RLConfig.from_args(["--actor.model_name_or_path", "smollm2", "--actor.autocast", "none",
                               "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "8",
                               "--rollout.max_new_tokens", "64", "--train.batch_size", "64",
                               "--train.micro_batch_size", "1", *flags])


TOOLS = ("--agent.tools", "builtin:calculator", "--agent.max_turns", "3", "--agent.tool_calls_per_episode", "2",
         "--agent.max_response_tokens", "1000")


def test_response_tokens_are_the_actions_plus_the_tool_results_up_to_the_budget():
    assert response_tokens(cfg_of())[0] == 64  # single-turn: max_new_tokens
    # 3 turns x 64 + 2 results x 100 = 392; x 300: 792; x 600: 1392, over the budget of 1000
    assert response_tokens(cfg_of(*TOOLS, "--agent.tool_result_tokens", "100"))[0] == 392
    assert response_tokens(cfg_of(*TOOLS, "--agent.tool_result_tokens", "300"))[0] == 792
    assert response_tokens(cfg_of(*TOOLS, "--agent.tool_result_tokens", "600"))[0] == 1000
    # without --agent.max_response_tokens the budget is 64 x 3 = 192, which actions and results share
    assert response_tokens(cfg_of("--agent.tools", "builtin:calculator", "--agent.max_turns", "3"))[0] == 192


def test_the_kv_cache_estimate_grows_with_the_tool_result_budget():
    """SmolLM2 in float32: 2 (k, v) x 30 layers x 3 KV heads x 64 dims x 4 bytes = 46,080 bytes per
    token of each of the 64 sequences decoded together (8 prompts x 8 samples); prompts of 100 tokens.
    Results of 100 tokens: 100 + 392 tokens, 46,080 x 64 x 492 = 1,450,967,040 bytes = 1.351 GiB;
    of 300 tokens: 100 + 792, 46,080 x 64 x 892 = 2,630,615,040 bytes = 2.450 GiB."""

    def kv_gib(result_tokens):
        lines = format_memory(cfg_of(*TOOLS, "--agent.tool_result_tokens", str(result_tokens)), SMOLLM2_CONFIG, 100)
        [line] = [x for x in lines if x.startswith("kv_cache")]
        return float(line.split()[1])

    assert kv_gib(100) == round(1_450_967_040 / GiB, 3) == 1.351
    assert kv_gib(300) == round(2_630_615_040 / GiB, 3) == 2.450
