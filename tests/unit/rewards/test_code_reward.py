"""The code-execution reward: label formats, per-test judging, honest solutions, builtin:code."""

import json
import os
import shutil

import pytest

from rlhfkit.api.builder import load_reward
from rlhfkit.config.rl import CodeRewardConfig, RewardConfig, RLConfig
from rlhfkit.errors import ConfigError, RewardError
from rlhfkit.rewards import code_sandbox
from rlhfkit.rewards.code import (
    CodeReward,
    CodeSandbox,
    CodeTests,
    code_reward,
    extract_code,
    normalize_output,
    parse_tests,
    run_tests,
    split_asserts,
)
from rlhfkit.rewards.resolve import resolve_reward

# Tests that run code under the default backend: skipped only where bwrap is not installed (where it
# is but cannot start, CodeSandbox's RewardError fails them).
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@pytest.fixture(scope="module")
def box():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    return CodeSandbox(cpu_seconds=1, wall_seconds=3, memory_mb=256, output_bytes=4096)


def test_extract_code():
    assert extract_code("so:\n```python\nx = 1\n```\nand\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("x = 3") == "x = 3"


def test_labels_in_every_format():
    asserts = "x = [3, 1]\nassert f(x) == [1, 3]\nassert f([]) == []\n"
    assert split_asserts(asserts) == ["x = [3, 1]\nassert f(x) == [1, 3]\n", "x = [3, 1]\nassert f([]) == []\n"]
    assert parse_tests(asserts).tests == tuple(split_asserts(asserts))
    assert parse_tests(json.dumps(["assert f(1) == 1", "assert f(2) == 2"])).tests == ("assert f(1) == 1",
                                                                                       "assert f(2) == 2")
    assert parse_tests({"tests": ["assert f(1) == 1"]}) == CodeTests("assert", ("assert f(1) == 1",))
    stdio = parse_tests(json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}))
    assert stdio == CodeTests("stdio", inputs=("1 2\n",), outputs=("3\n",))
    call = parse_tests({"input_output": json.dumps({"fn_name": "f", "inputs": [[1, 2]], "outputs": [[3]]})})
    assert call == CodeTests("call", fn_name="f", inputs=([1, 2],), outputs=([3],)) and len(call) == 1
    with pytest.raises(RewardError, match="2 inputs but 1 outputs"):
        parse_tests({"inputs": ["1", "2"], "outputs": ["1"]})
    with pytest.raises(RewardError, match="code label must be"):
        parse_tests({"answer": 3})
    assert normalize_output("  1   2 \n3\n\n\n") == ["1 2", "3"] == normalize_output("1 2\n3")


def test_honest_solutions_score_one_in_every_style(box):
    add = "```python\ndef add(a, b):\n    return a + b\n```"
    assert run_tests(extract_code(add), "assert add(2, 3) == 5\nassert add((1,), (2,)) == (1, 2)\n"
                     "assert add({1: 2}.get(1), 0.5) == 2.5\nassert add('a', 'b') in {'ab'}", box).passed == (True,) * 4
    leetcode = ("class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
                "        for i, n in enumerate(nums):\n            if target - n in seen:\n"
                "                return [seen[target - n], i]\n            seen[n] = i\n")
    call = {"fn_name": "twoSum", "inputs": [[[2, 7, 11], 9], [[3, 3], 6]], "outputs": [[[0, 1]], [0, 1]]}
    assert run_tests(leetcode, call, box).passed == (True, True)
    assert run_tests(leetcode, "assert Solution().twoSum([1, 5], 6) == [0, 1]", box).passed == (True,)
    stdio = {"inputs": ["2\n1 2\n3 4\n", "0\n"], "outputs": ["3\n7", ""]}
    script = "n = int(input())\nfor _ in range(n):\n    a, b = map(int, input().split())\n    print(a + b, ' ')\n"
    assert run_tests(script, stdio, box).passed == (True, True)
    uses_math = "import math, os.path as osp\ndef area(r):\n    return math.pi * r * r\n"
    assert run_tests(uses_math, "assert math.isclose(area(1), 3.14159, rel_tol=1e-3)\n"
                     "assert osp.join('a', 'b') == 'a/b'", box).passed == (True, True)
    stateful = "class Counter:\n    def __init__(self):\n        self.n = 0\n    def tick(self):\n" \
               "        self.n += 1\n        return self.n\n"
    assert run_tests(stateful, "c = Counter()\nc.tick()\nassert c.tick() == 2", box).passed == (True,)


def test_reward_all_or_fraction_and_logs(box):
    tests = ["assert add(2, 3) == 5\nassert add(0, 0) == 0"] * 3
    responses = ["```python\ndef add(a, b):\n    return a + b\n```", "def add(a, b):\n    return a * b * 0",
                 "def add(a, b) return"]
    out = code_reward(responses, tests, box)
    assert out.rewards.tolist() == [1.0, 0.0, 0.0] and out.scores.tolist() == [1.0, 0.0, 0.0]
    assert out.extra_logs["timed_out"].tolist() == [0.0, 0.0, 0.0]
    partial = code_reward(responses, tests, box, partial_credit=True)
    assert partial.rewards.tolist() == [1.0, 0.5, 0.0] and partial.scores.tolist() == [1.0, 0.0, 0.0]
    assert partial.extra_logs["pass_fraction"].tolist() == [1.0, 0.5, 0.0]


def test_a_failing_test_does_not_spoil_the_next(box):
    code = "calls = []\ndef f(x):\n    calls.append(x)\n    if x == 1:\n        import os\n        os._exit(0)\n" \
           "    return len(calls)\n"
    assert run_tests(code, "assert f(1) == 1\nassert f(2) == 1\nassert f(3) == 1", box).passed == (False, True, True)


def test_scripts_can_use_their_directory_and_the_stdlib(box):
    r = box.run("import json, math, collections, re\nopen('f.txt', 'w').write('hi')\nprint(open('f.txt').read())")
    assert r.passed and r.output.strip() == "hi"
    r = box.run("while True:\n    print('x' * 10000)")
    assert not r.passed and len(r.output) <= 4096


@needs_bwrap
def test_builtin_code_reads_the_label_and_the_settings():
    fn = resolve_reward("builtin:code", code_options={"partial_credit": True, "timeout": 3.0})
    assert isinstance(fn, CodeReward) and fn.partial_credit and fn.limits["wall_seconds"] == 3.0
    prompts = ["Write add.\n", "Write add.\n"]
    queries = [p + r for p, r in zip(prompts, ["```python\ndef add(a, b):\n    return a + b\n```",
                                               "def add(a, b):\n    return 5"])]
    labels = [json.dumps({"fn_name": "add", "inputs": [[2, 3], [1, 1]], "outputs": [5, 2]})] * 2
    out = fn(queries, prompts, labels)
    assert out.rewards.tolist() == [1.0, 0.5] and out.scores.tolist() == [1.0, 0.0]
    cfg = RLConfig.from_args(["--reward.remote_url", "builtin:code", "--reward.code.partial_credit",
                              "--reward.code.timeout", "2"])
    assert cfg.reward.code == CodeRewardConfig(partial_credit=True, timeout=2.0)
    loaded = load_reward(cfg.reward)
    assert loaded.fn.partial_credit and loaded.fn.limits["wall_seconds"] == 2.0
    assert not load_reward(RewardConfig(remote_url="builtin:code")).fn.partial_credit
    with pytest.raises(ConfigError, match="--reward.code.timeout must be > 0"):
        RLConfig.from_args(["--reward.remote_url", "builtin:code", "--reward.code.timeout", "0"])


@needs_bwrap
def test_the_reward_file_runs_as_a_plain_reward_func():
    from rlhfkit.rewards import builtin_code_reward
    out = builtin_code_reward.reward_func(["def f():\n    return 1"], [""], ["assert f() == 1"])
    assert out["rewards"].tolist() == [1.0]


@pytest.fixture
def bwrap_on_path(monkeypatch):
    """bwrap found on PATH, installed or not (its start is what the tests then make fail)."""
    which = shutil.which
    monkeypatch.setattr(code_sandbox.shutil, "which",
                        lambda name, path=None: "/usr/bin/bwrap" if name == "bwrap" else which(name, path=path))


def test_where_bwrap_cannot_start_the_sandbox_refuses_in_one_line(monkeypatch, bwrap_on_path):
    monkeypatch.setattr(CodeSandbox, "_start_error", lambda self: "bwrap: No permissions to create new namespace")
    with pytest.raises(RewardError, match=r"^bwrap cannot start a Python child here \(.*No permissions.*\): "
                                          r"install bubblewrap.*--reward.code.sandbox none") as e:
        CodeSandbox()
    assert "\n" not in str(e.value)
    monkeypatch.setattr(code_sandbox.shutil, "which", lambda name, path=None: None)
    with pytest.raises(RewardError, match=r"needs bubblewrap \(bwrap\), which is not on PATH: install bubblewrap"):
        CodeSandbox()


def test_none_runs_unconfined_with_a_warning_and_judges_the_same(caplog):
    with caplog.at_level("WARNING", logger="rlhfkit"):
        box = CodeSandbox("none", cpu_seconds=1, wall_seconds=3)
    assert "model code runs unconfined" in caplog.text
    assert run_tests("def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3", box).passed == (True,)
    assert run_tests("def add(a, b):\n    return 0\nraise SystemExit(0)", "assert add(1, 2) == 3",
                     box).passed == (False,)
    assert box.run("print(input())", stdin="x\n").output == "x\n"
    workdir = box.run("import os\nopen('f', 'w').write('x')\nprint(os.getcwd())").output.strip()
    assert workdir.startswith("/") and not os.path.exists(workdir)  # its temporary directory is removed


def test_config_validates_the_backend_and_the_remote_url():
    assert RLConfig.from_args([]).reward.code.sandbox == "bwrap"
    with pytest.raises(ConfigError, match="--reward.code.sandbox: unknown value 'docker'; valid: bwrap, remote, none"):
        RLConfig.from_args(["--reward.code.sandbox", "docker"])
    with pytest.raises(ConfigError, match="--reward.code.sandbox remote needs --reward.code.remote_url"):
        RLConfig.from_args(["--reward.code.sandbox", "remote"])
    with pytest.raises(RewardError, match="--reward.code.sandbox remote needs --reward.code.remote_url"):
        CodeReward(sandbox="remote")


def test_cli_refuses_before_any_model_loads_when_code_cannot_be_contained(monkeypatch, tmp_path, capsys,
                                                                          bwrap_on_path):
    from rlhfkit.cli.main import main
    monkeypatch.setattr(CodeSandbox, "_start_error", lambda self: "bwrap: setting up uid map: Permission denied")
    data = tmp_path / "code.jsonl"
    data.write_text(json.dumps({"input": "Write add.", "label": "assert add(1, 2) == 3"}) + "\n")
    rc = main(["train", "rl", "--actor.model_name_or_path", str(tmp_path / "no_model"),
               "--data.prompt_dataset", str(data), "--data.label_key", "label",
               "--reward.remote_url", "builtin:code", "--ckpt.output_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("error: bwrap cannot start a Python child here")
    assert err[0].endswith("or --reward.code.sandbox none to run model code unconfined")


def test_bwrap_sees_usr_the_interpreters_prefix_and_venv_read_only_and_three_tmpfs(box):
    args = box._bwrap_mounts(["/usr", "/opt/py/3.11", "/srv/venv"])
    binds = [args[i + 1] for i, a in enumerate(args) if a == "--ro-bind"]
    assert binds[0] == "/usr" and binds[-2:] == ["/opt/py/3.11", "/srv/venv"]
    assert all(b in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32") for b in binds[1:-2])
    k = args.index("/opt")
    assert args[k - 3:k + 15] == ["--perms", "0755", "--dir", "/opt", "--perms", "0755", "--dir", "/opt/py",
                                  "--ro-bind", "/opt/py/3.11", "/opt/py/3.11",
                                  "--perms", "0755", "--dir", "/srv", "--ro-bind", "/srv/venv", "/srv/venv"]
    tail = ["--proc", "/proc", "--dev", "/dev", "--size", str(64 << 20), "--perms", "1777", "--tmpfs", "/tmp",
            "--size", str(64 << 20), "--perms", "1777", "--tmpfs", "/sandbox",
            "--size", str(64 << 20), "--perms", "1777", "--tmpfs", "/dev/shm", "--remount-ro", "/",
            "--remount-ro", "/dev", "--chdir", "/sandbox"]
    assert args[k + 15:] == tail
