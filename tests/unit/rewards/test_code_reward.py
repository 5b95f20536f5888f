"""The code-execution reward: right code passes, and each hostile program is contained."""

import socket
import threading

import pytest

from rlhfkit.rewards.code import CodeSandbox, code_reward, extract_code


@pytest.fixture(scope="module")
def box():
    return CodeSandbox(cpu_seconds=1, wall_seconds=3, memory_mb=256, output_bytes=4096)


def test_extract_code():
    assert extract_code("so:\n```python\nx = 1\n```\nand\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("x = 3") == "x = 3"


def test_reward_passes_right_code_and_fails_wrong_code(box):
    tests = ["assert add(2, 3) == 5", "assert add(2, 3) == 5", "assert add(2, 3) == 5"]
    responses = ["```python\ndef add(a, b):\n    return a + b\n```", "def add(a, b):\n    return a - b",
                 "def add(a, b) return"]
    out = code_reward(responses, tests, box)
    assert out.rewards.tolist() == [1.0, 0.0, 0.0] and out.extra_logs["timed_out"].tolist() == [0.0, 0.0, 0.0]


def test_normal_programs_can_import_and_use_their_directory(box):
    r = box.run("import json, math, collections, re\nopen('f.txt', 'w').write('hi')\nprint(open('f.txt').read())")
    assert r.passed and r.output.strip() == "hi"


def test_infinite_loop_is_killed_by_the_cpu_limit(box):
    r = box.run("while True:\n    pass")
    assert not r.passed and r.returncode is not None and r.returncode < 0  # SIGXCPU / SIGKILL


def test_sleeping_program_is_killed_on_the_wall_clock(box):
    r = box.run("import time\ntime.sleep(60)")
    assert not r.passed and r.timed_out and r.returncode is None


def test_fork_bomb_is_refused(box):
    r = box.run("import os\nwhile True:\n    os.fork()")
    assert not r.passed and "os.fork is not allowed" in r.output
    r = box.run("import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])")
    assert not r.passed and "subprocess.Popen is not allowed" in r.output


def test_reading_and_listing_outside_the_directory_is_refused(box, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN")
    r = box.run(f"print(open({str(secret)!r}).read())")
    assert not r.passed and "TOKEN" not in r.output and "is not allowed" in r.output
    r = box.run("import os\nprint(os.listdir('/'))")
    assert not r.passed and "os.listdir / is not allowed" in r.output
    r = box.run("open('../escape.txt', 'w').write('x')")
    assert not r.passed and "is not allowed" in r.output


def test_sockets_are_refused(box):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    try:
        for code in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}))",
                     f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))"):
            r = box.run(code)
            assert not r.passed and "socket" in r.output
        assert accepted == []
    finally:
        listener.close()


def test_huge_output_is_capped(box):
    r = box.run("while True:\n    print('x' * 10000)")
    assert not r.passed and len(r.output) <= 4096


def test_memory_hog_is_refused(box):
    r = box.run("x = bytearray(10 ** 10)")
    assert not r.passed and "MemoryError" in r.output
