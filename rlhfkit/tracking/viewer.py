"""A static HTML page of the completions in `samples.jsonl`, filterable by step, reward and text.

`write_viewer(run_dir)` reads `run_dir/samples.jsonl` (written by `CompletionLogger`) and writes
`run_dir/samples.html`: one self-contained file (inline CSS and JS, the samples embedded as JSON,
no network request) that any browser opens from disk. Filters: step range, reward range and a
text search; they start from the page's URL fragment, e.g. `samples.html#step=3-5&rmin=0.5&q=42`,
so a filtered view can be bookmarked (and tested headlessly).

A row with `messages` (an agent's or tool-calling episode: samples.jsonl of a run with tools,
eval_samples.jsonl of `rlhfkit eval`, generations.jsonl) shows its response as turns: each
assistant turn with its tool calls (`-> name(arguments)`), each tool result with the tool's name
(`conversation_turns`). The text search covers the turns.

Imports nothing from rlhfkit (errors here are ValueError / FileNotFoundError).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from rlhfkit.tracking.samples import SAMPLES_FILE

VIEWER_FILE = "samples.html"

_CSS = """
body{font-family:system-ui,sans-serif;margin:1em;background:#fafafa;color:#222}
#filters{position:sticky;top:0;background:#fff;padding:.5em;border:1px solid #ccc;display:flex;gap:1em;
flex-wrap:wrap;align-items:center}
#filters input{width:6em}#filters input#q{width:14em}
table{border-collapse:collapse;width:100%;margin-top:.5em}
td,th{border:1px solid #ddd;padding:4px;vertical-align:top;text-align:left}
td.text{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px;max-width:40em}
div.turn{border-left:3px solid #99c;padding-left:4px;margin-bottom:4px}
div.turn.tool{border-color:#c96;background:#fff8ee}
div.turn b{font-family:system-ui,sans-serif}div.call{color:#036}
tr.pos td.r{background:#dfd}tr.neg td.r{background:#fdd}
"""

_JS = r"""
const DATA = JSON.parse(document.getElementById('data').textContent);
const $ = id => document.getElementById(id);
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));}
function showTurns(ts){return ts.map(t=>`<div class="turn ${esc(t.role)}">`+
  `<b>${esc(t.role)}${t.name?' '+esc(t.name):''}</b>\n`+esc(t.content)+
  t.calls.map(c=>`<div class="call">-&gt; ${esc(c)}</div>`).join('')+'</div>').join('');}
function num(v){return (v===null||v===undefined||v==='')?null:Number(v);}
function fromHash(){
  const h=new URLSearchParams(location.hash.slice(1));
  if(h.has('step')){const [a,b]=h.get('step').split('-');$('smin').value=a;$('smax').value=(b===undefined?a:b);}
  for(const k of ['rmin','rmax','q']) if(h.has(k)) $(k).value=h.get(k);
}
function render(){
  const smin=num($('smin').value), smax=num($('smax').value), rmin=num($('rmin').value), rmax=num($('rmax').value);
  const q=$('q').value.toLowerCase();
  const rows=DATA.filter(d=>(smin===null||d.step>=smin)&&(smax===null||d.step<=smax)
    &&(rmin===null||(d.reward!==null&&d.reward>=rmin))&&(rmax===null||(d.reward!==null&&d.reward<=rmax))
    &&(!q||(String(d.prompt)+'\n'+String(d.response)+'\n'+JSON.stringify(d.turns??[])).toLowerCase().includes(q)));
  const fmt=v=>(typeof v==='number')?v.toFixed(3):(v===undefined||v===null?'':esc(v));
  $('rows').innerHTML=rows.map(d=>`<tr class="sample ${d.reward>0?'pos':'neg'}" data-step="${d.step}" `+
    `data-reward="${d.reward}"><td>${d.step}</td><td class="r">${fmt(d.reward)}</td><td>${fmt(d.advantage)}</td>`+
    `<td>${fmt(d.length)}</td><td class="text">${esc(d.prompt??'')}</td>`+
    `<td class="text">${d.turns?showTurns(d.turns):esc(d.response??'')}</td>`+
    `<td>${esc(d.label??'')}</td></tr>`).join('');
  $('count').textContent=`${rows.length} of ${DATA.length} samples`;
}
fromHash();
for(const id of ['smin','smax','rmin','rmax','q']) $(id).addEventListener('input',render);
window.addEventListener('hashchange',()=>{fromHash();render();});
render();
"""


def read_samples(path: str | Path) -> list[dict]:
    """The rows of a samples jsonl file (a torn last line is skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is this a run folder (it needs {SAMPLES_FILE})?")
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines):
                break
            raise ValueError(f"{path}, line {i}: not valid JSON ({exc.msg})") from exc
    return rows


def conversation_turns(messages: list[dict], prompt_messages: int | None = None) -> list[dict]:
    """The turns after the prompt of an episode's `messages` (its first `prompt_messages`; unknown:
    up to its last user or system message): {role, name (a tool result's tool), content, calls
    (each `name(arguments)`)}."""
    start = prompt_messages if isinstance(prompt_messages, int) else max(
        (i + 1 for i, m in enumerate(messages) if m.get("role") in ("user", "system")), default=0)
    out = []
    for m in messages[start:]:
        calls = []
        for c in m.get("tool_calls") or []:
            fn = c.get("function", c) if isinstance(c, dict) else {}
            args = fn.get("arguments", {})
            calls.append(f"{fn.get('name')}({args if isinstance(args, str) else json.dumps(args)})")
        content = m.get("content")
        out.append({"role": str(m.get("role")), "name": m.get("name") if m.get("role") == "tool" else None,
                    "content": content if isinstance(content, str) else json.dumps(content), "calls": calls})
    return out


def render_html(rows: list[dict], title: str) -> str:
    """The page for `rows` (dicts with step, prompt, response, reward, advantage, length, label;
    optionally messages, shown as turns)."""
    rows = [{**r, "turns": conversation_turns(r["messages"], r.get("prompt_messages"))}
            if isinstance(r.get("messages"), list) else r for r in rows]
    # "</" cannot end the <script> early once escaped; JSON stays valid.
    data = json.dumps(rows, ensure_ascii=False).replace("</", "<\\/")
    steps = sorted({r.get("step", 0) for r in rows})
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<div id="filters">
<label>step <input id="smin" type="number" placeholder="{steps[0] if steps else ''}"> to
<input id="smax" type="number" placeholder="{steps[-1] if steps else ''}"></label>
<label>reward <input id="rmin" type="number" step="any" placeholder="min"> to
<input id="rmax" type="number" step="any" placeholder="max"></label>
<label>text <input id="q" type="search" placeholder="search prompt and response"></label>
<span id="count"></span></div>
<table><thead><tr><th>step</th><th>reward</th><th>advantage</th><th>length</th><th>prompt</th>
<th>response</th><th>label</th></tr></thead><tbody id="rows"></tbody></table>
<script type="application/json" id="data">{data}</script>
<script>{_JS}</script>
</body></html>
"""


def write_viewer(run_dir: str | Path, samples_file: str = SAMPLES_FILE, out_file: str = VIEWER_FILE) -> Path:
    """Write `run_dir/out_file` from `run_dir/samples_file`; return its path."""
    run_dir = Path(run_dir)
    rows = read_samples(run_dir / samples_file)
    out = run_dir / out_file
    out.write_text(render_html(rows, f"{run_dir.name}: {len(rows)} samples"), encoding="utf-8")
    return out
