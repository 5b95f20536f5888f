"""The sample viewer: a static page that a headless Chromium renders, and whose filters work."""

import json
import re
import shutil
import subprocess

import pytest

from rlhfkit.cli.main import main
from rlhfkit.tracking.viewer import conversation_turns, read_samples, render_html, write_viewer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def write_samples(run_dir):
    rows = [{"step": s, "prompt": f"What is {s}+{i}? </script><b>bold</b>", "response": f"{s + i}" if i % 2 else "no",
             "label": str(s + i), "reward": float(i % 2), "advantage": 0.5 if i % 2 else -0.5, "length": 3}
            for s in range(1, 4) for i in range(4)]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "pro')
    return rows


def dump_dom(page, fragment, tmp_path):
    """The DOM after the page's scripts ran, from headless Chromium with no network."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--dump-dom", f"{page.as_uri()}#{fragment}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


def shown(dom):
    return [(int(s), float(r))
            for s, r in re.findall(r'class="sample \w+" data-step="(\d+)" data-reward="([\d.]+)"', dom)]


def test_page_is_self_contained_and_escapes_text(tmp_path):
    rows = write_samples(tmp_path)
    assert read_samples(tmp_path / "samples.jsonl") == rows  # the torn last line is skipped
    page = render_html(rows, "t")
    assert "http://" not in page and "https://" not in page and "<link" not in page and " src=" not in page
    assert "</script><b>" not in page  # a prompt cannot close the data script


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_chromium_shows_samples_and_filters_by_step_reward_and_text(tmp_path):
    write_samples(tmp_path / "run")
    assert main(["view", str(tmp_path / "run")]) == 0
    page = tmp_path / "run" / "samples.html"
    dom = dump_dom(page, "", tmp_path)
    assert len(shown(dom)) == 12 and "12 of 12 samples" in dom
    assert "What is 2+1? &lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;" in dom  # shown as text, not markup
    dom = dump_dom(page, "step=2-3&rmin=0.5", tmp_path)
    assert sorted(shown(dom)) == [(2, 1.0), (2, 1.0), (3, 1.0), (3, 1.0)] and "4 of 12 samples" in dom
    dom = dump_dom(page, "rmax=0&q=what is 3%2B2", tmp_path)
    assert shown(dom) == [(3, 0.0)]


def test_view_needs_a_run_folder(tmp_path, capsys):
    assert main(["view", str(tmp_path)]) == 2
    assert "samples.jsonl does not exist" in capsys.readouterr().err
    write_samples(tmp_path)
    assert write_viewer(tmp_path).name == "samples.html"


EPISODE = [
    {"role": "system", "content": "tools..."},
    {"role": "user", "content": "What is 3*4?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "call_0", "type": "function",
                     "function": {"name": "multiply", "arguments": '{"a": 3, "b": 4}'}}]},
    {"role": "tool", "tool_call_id": "call_0", "name": "multiply", "content": "12"},
    {"role": "assistant", "content": "3*4 = 12 <b>"},
]


def test_an_episode_is_shown_as_turns_after_the_prompt():
    turns = conversation_turns(EPISODE)
    assert turns == [
        {"role": "assistant", "name": None, "content": "", "calls": ['multiply({"a": 3, "b": 4})']},
        {"role": "tool", "name": "multiply", "content": "12", "calls": []},
        {"role": "assistant", "name": None, "content": "3*4 = 12 <b>", "calls": []},
    ]
    few_shot = [EPISODE[1], *EPISODE[2:], {"role": "user", "content": "And 5*5?"}, EPISODE[-1]]
    assert [t["role"] for t in conversation_turns(few_shot)] == ["assistant"]  # the example is the prompt's
    game = [EPISODE[1], EPISODE[-1], {"role": "user", "content": "lower"}, EPISODE[-1]]  # an environment's turn
    assert [t["role"] for t in conversation_turns(game, prompt_messages=1)] == ["assistant", "user", "assistant"]
    page = render_html([{"step": 1, "prompt": "p", "response": "r", "reward": 1.0, "messages": EPISODE}], "t")
    assert '"calls": ["multiply(' in page and "3*4 = 12 <b>" in page  # the turns ride in the page's data


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_chromium_shows_tool_calls_and_results_as_turns(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 1, "prompt": "p", "response": "flat text", "reward": 1.0, "messages": EPISODE},
            {"step": 1, "prompt": "q", "response": "no tools here", "reward": 0.0}]
    (run / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["view", str(run), "--file", "eval_samples.jsonl"]) == 0
    dom = dump_dom(run / "eval_samples.html", "", tmp_path)
    table = dom[dom.index('<tbody id="rows">'):dom.index("</tbody>")]  # the rendered rows, not the data
    assert '<div class="turn tool"><b>tool multiply</b>' in table and "-&gt; multiply({" in table
    assert "3*4 = 12 &lt;b&gt;" in table and "flat text" not in table and "no tools here" in table
    assert shown(dump_dom(run / "eval_samples.html", "q=multiply", tmp_path)) == [(1, 1.0)]
