"""The verifiers adapter's pieces: a row's RolloutInput, the environment's own rows, what is refused."""

import asyncio
import sys
from types import SimpleNamespace

import pytest

from rlhfkit.agents.endpoint import verifiers_env as V
from rlhfkit.errors import ConfigError


def env(system=None, few_shot=None):
    return SimpleNamespace(system_prompt=system, few_shot=few_shot)


def test_a_string_prompt_gets_the_system_prompt_few_shot_turns_and_the_label_as_answer():
    shot = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]
    out = V.rollout_input(env("be brief", shot), "2+2", 4, {"example_id": 3, "info": {"k": 1}})
    assert out == {"prompt": [{"role": "system", "content": "be brief"}, *shot, {"role": "user", "content": "2+2"}],
                   "example_id": 3, "info": {"k": 1}, "answer": "4"}


def test_a_message_prompt_keeps_its_own_system_turn_and_the_answer_column_stands_in_for_a_label():
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "q"}]
    assert V.rollout_input(env("theirs"), own, None, {"answer": "a"}) == \
        {"prompt": own, "example_id": 0, "info": {}, "answer": "a"}
    bare = [{"role": "user", "content": "q"}]
    out = V.rollout_input(env("theirs"), bare, None, {})
    assert out["prompt"] == [{"role": "system", "content": "theirs"}, *bare] and "answer" not in out


def test_only_objects_with_rollouts_a_rubric_and_a_dataset_count_as_verifiers_environments():
    async def fn(client, prompt, label, **row):
        return 1.0

    full = SimpleNamespace(run_rollout=fn, rubric=object(), get_dataset=list)
    assert V.is_verifiers_env(full)
    assert not V.is_verifiers_env(fn) and not V.is_verifiers_env(SimpleNamespace(run_rollout=fn, rubric=None))


def test_without_the_package_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ConfigError, match=r"rlhfkit\[verifiers\]"):
        V.load_verifiers_env("verifiers:gsm8k")
    with pytest.raises(ConfigError, match="name the environment"):
        V.load_verifiers_env("verifiers:")


def sevens(completion, answer, **kwargs):
    return 1.0


def test_the_environments_rows_its_prompt_under_input_key_and_a_rollouts_reward_is_the_rubrics():
    vf = pytest.importorskip("verifiers")
    from datasets import Dataset

    data = Dataset.from_list([{"question": "q0", "answer": "7"}])
    e = vf.SingleTurnEnv(dataset=data, system_prompt="s", rubric=vf.Rubric(funcs=[sevens], weights=[0.25]))
    rows = V.VerifiersExecutor(e).own_dataset("input")
    assert rows == [{"input": [{"role": "system", "content": "s"}, {"role": "user", "content": "q0"}],
                     "question": "q0", "answer": "7", "example_id": 0}]
    seen = {}

    async def run_rollout(input, client, model, sampling_args):
        seen.update(input=input, model=model, client=client.client, sampling_args=sampling_args)
        return {"reward": 0.25, "metrics": {"sevens": 1.0}, "error": None}

    e.run_rollout = run_rollout
    out = asyncio.run(V.verifiers_agent(e)("CLIENT", rows[0]["input"], None, **rows[0]))
    assert out == {"reward": 0.25, "extra_logs": {"sevens": 1.0, "vf_error": 0.0}}
    assert seen == {"input": {"prompt": rows[0]["input"], "example_id": 0, "info": {}, "answer": "7"},
                    "model": "policy", "client": "CLIENT", "sampling_args": {"n": 1, "extra_body": {}}}


def group_share(completions, **kwargs):
    return [1.0 for _ in completions]


def test_a_rubric_with_group_reward_functions_is_refused():
    vf = pytest.importorskip("verifiers")
    from datasets import Dataset

    e = vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]),
                         rubric=vf.Rubric(funcs=[group_share]))
    with pytest.raises(ConfigError, match="group reward functions"):
        V.verifiers_agent(e)


def test_an_environment_module_that_returns_something_else_is_refused(tmp_path, monkeypatch):
    pytest.importorskip("verifiers")
    (tmp_path / "not_an_env.py").write_text("from types import SimpleNamespace\n\n\ndef load_environment():\n"
                                            "    return SimpleNamespace(env_id='', env_args={})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="not a vf.Environment"):
        V.load_verifiers_env("verifiers:not-an-env")
    with pytest.raises(ConfigError, match="Could not import 'no-such-env'"):
        V.load_verifiers_env("verifiers:no-such-env")
