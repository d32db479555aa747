"""A page to inspect why two systems differ: one self-contained HTML file (no server, no external
file) for a system against its baseline on one dataset.

- a summary: each system's figure (mean over its seeds), the difference, the test of these runs
  and, where both have several seeds, the recipe test (`taser.evaluation.comparison`);
- the questions that flipped at k: found (an answer in the first k passages) by one system and
  missed by the other, as a fraction of each system's seeds; sortable by any column and filtered by
  text and by kind (gained, lost, mixed); each row opens on the question, its gold answers and both
  systems' first passages (of their first seed) with the answers highlighted;
- the report's top-k curve, embedded, when it was drawn.

Questions, answers and passages come from the `retrieval.json` each evaluation writes beside its
`results.json`; without it a row shows the question's id only. The filter can also be set from the
address (`page.html#q=word&kind=lost`), so a link opens on a given view.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Sequence
from pathlib import Path

from taser.data.retrieval_json import iter_retrieval_results
from taser.evaluation.comparison import Comparison
from taser.evaluation.per_query import metric_values
from taser.evaluation.runs import RunResult
from taser.io import atomic_open

PASSAGES_SHOWN = 5


def _retrieval(run: RunResult) -> list[dict] | None:
    if not run.path:
        return None
    path = Path(run.path).parent / "retrieval.json"
    return list(iter_retrieval_results(path)) if path.is_file() else None


def _hits(runs: Sequence[RunResult], k: int) -> dict[str, float]:
    """Question id -> the fraction of the runs (seeds) that find an answer in the first k passages."""
    total: dict[str, float] = {}
    for run in runs:
        values = metric_values(run.per_query, f"top-{k}")
        for record, value in zip(run.per_query, values):
            total[str(record["id"])] = total.get(str(record["id"]), 0.0) + value / 100.0
    return {q: v / len(runs) for q, v in total.items()}


def _highlight(text: str, answers: Sequence[str]) -> str:
    """`text` escaped, with every occurrence of an answer (longest first, case-insensitive) marked:
    matched on the raw text, so markup never lands inside an entity or another mark."""
    wanted = sorted({a for a in answers if isinstance(a, str) and a.strip()}, key=len, reverse=True)
    if not wanted:
        return html.escape(text)
    pattern = re.compile("|".join(re.escape(a) for a in wanted), re.IGNORECASE)
    out, last = [], 0
    for m in pattern.finditer(text):
        out += [html.escape(text[last : m.start()]), f"<mark>{html.escape(m.group(0))}</mark>"]
        last = m.end()
    return "".join(out) + html.escape(text[last:])


def _passages(record: dict | None, answers: Sequence[str], k: int) -> str:
    if record is None:
        return "<p><i>no retrieval.json beside this run's results</i></p>"
    items = []
    for rank, ctx in enumerate(record["ctxs"][: min(k, PASSAGES_SHOWN)], 1):
        flag = "✓" if ctx.get("has_answer") else "·"
        items.append(f"<li><b>{flag} {rank}. {html.escape(str(ctx.get('title', '')))}</b> {_highlight(str(ctx.get('text', '')), answers)}</li>")
    return "<ol class=passages>" + "".join(items) + "</ol>"


def _kind(mine: float, theirs: float) -> str:
    """gained: found by the system at every seed and by the baseline at none; lost: the reverse; mixed: the rest."""
    if mine == 1 and theirs == 0:
        return "gained"
    if mine == 0 and theirs == 1:
        return "lost"
    return "mixed"


def inspection_page(system_runs: Sequence[RunResult], baseline_runs: Sequence[RunResult], k: int, comparison: Comparison | None = None,
                    plot: str | os.PathLike | None = None) -> str:
    """The page's HTML: `system_runs` (its seeds) against `baseline_runs` on one dataset at top-k."""
    system, baseline = system_runs[0].system, baseline_runs[0].system
    dataset = system_runs[0].dataset
    if any(r.per_query is None for r in [*system_runs, *baseline_runs]):
        raise ValueError(f"inspecting {system} against {baseline} needs every run's per_query.jsonl")
    mine, theirs = _hits(system_runs, k), _hits(baseline_runs, k)
    if set(mine) != set(theirs):
        raise ValueError(f"{system} and {baseline} were evaluated on different questions")
    retrieved_mine, retrieved_theirs = _retrieval(system_runs[0]), _retrieval(baseline_runs[0])
    rows = []
    for position, qid in enumerate(system_runs[0].per_query and [str(r["id"]) for r in system_runs[0].per_query]):
        if mine[qid] == theirs[qid]:
            continue
        index = int(qid) if qid.isdigit() else position
        rec_mine = retrieved_mine[index] if retrieved_mine and index < len(retrieved_mine) else None
        rec_theirs = retrieved_theirs[index] if retrieved_theirs and index < len(retrieved_theirs) else None
        question = (rec_mine or rec_theirs or {}).get("question", f"question {qid}")
        answers = [str(a) for a in (rec_mine or rec_theirs or {}).get("answers", [])]
        kind = _kind(mine[qid], theirs[qid])
        detail = (f"<div class=detail><p><b>Answers:</b> {html.escape(' | '.join(answers)) or '–'}</p>"
                  f"<div class=cols><div><h4>{html.escape(system)}</h4>{_passages(rec_mine, answers, k)}</div>"
                  f"<div><h4>{html.escape(baseline)}</h4>{_passages(rec_theirs, answers, k)}</div></div></div>")
        rows.append(f"<tr class=row data-kind={kind} data-text=\"{html.escape(question.lower())}\"><td>{html.escape(qid)}</td>"
                    f"<td><details><summary>{html.escape(question)}</summary>{detail}</details></td>"
                    f"<td>{mine[qid]:.2f}</td><td>{theirs[qid]:.2f}</td><td>{mine[qid] - theirs[qid]:+.2f}</td><td>{kind}</td></tr>")
    summary = _summary(system_runs, baseline_runs, k, comparison, mine, theirs)
    figure = ""
    if plot and Path(plot).is_file():
        encoded = base64.b64encode(Path(plot).read_bytes()).decode()
        figure = f"<h2>Top-k accuracy</h2><img alt='top-k accuracy curves' src='data:image/png;base64,{encoded}'>"
    title = f"{system} against {baseline} on {dataset}, top-{k}"
    return _PAGE.format(title=html.escape(title), summary=summary, rows="".join(rows), count=len(rows), figure=figure,
                        system=html.escape(system), baseline=html.escape(baseline), k=k)


def _summary(system_runs, baseline_runs, k, comparison, mine, theirs) -> str:
    n = len(mine)
    a, b = sum(mine.values()) / n * 100, sum(theirs.values()) / n * 100
    gained = sum(1 for q in mine if _kind(mine[q], theirs[q]) == "gained" and mine[q] != theirs[q])
    lost = sum(1 for q in mine if _kind(mine[q], theirs[q]) == "lost" and mine[q] != theirs[q])
    lines = [f"<tr><td>{html.escape(system_runs[0].system)}</td><td>{a:.1f}</td><td>{len(system_runs)}</td></tr>",
             f"<tr><td>{html.escape(baseline_runs[0].system)}</td><td>{b:.1f}</td><td>{len(baseline_runs)}</td></tr>"]
    tests = ""
    cell = comparison.cells.get((system_runs[0].system, system_runs[0].dataset, f"top-{k}")) if comparison else None
    if cell is not None and cell.p is not None:
        tests = f"<p>Δ {cell.delta:+.2f}; these runs: p = {cell.p:.3g} ({cell.p_method}), Holm {cell.p_holm:.3g}"
        if cell.recipe is not None:
            tests += (f"; the recipe ({cell.recipe.design}, seeds {', '.join(map(str, cell.recipe.seeds))}): p = {cell.recipe.p:.3g}, "
                      f"Holm {cell.recipe_holm:.3g}, detectable at 80% power: {cell.recipe.detectable():.2f}")
        tests += ".</p>"
    return (f"<table class=summary><tr><th>system</th><th>top-{k}</th><th>seeds</th></tr>{''.join(lines)}</table>{tests}"
            f"<p>{n:,} questions: {gained} found by {html.escape(system_runs[0].system)} only at every seed, {lost} by "
            f"{html.escape(baseline_runs[0].system)} only; the rest of the rows below differ in part of the seeds.</p>")


_PAGE = """<!DOCTYPE html>
<html lang=en><head><meta charset=utf-8><title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; }} th, td {{ border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ cursor: pointer; background: #f4f4f4; }} mark {{ background: #ffe066; }} .cols {{ display: flex; gap: 2em; }}
.cols > div {{ flex: 1; }} .passages li {{ margin-bottom: .4em; }} #controls {{ margin: 1em 0; }}
</style></head><body>
<h1>{title}</h1>
{summary}
<h2>Questions that flipped at top-{k} (<span id=shown>{count}</span> of {count} shown)</h2>
<div id=controls><label>Filter: <input id=q type=search placeholder="words of the question"></label>
<label>Kind: <select id=kind><option value="">all</option><option value=gained>gained by {system}</option>
<option value=lost>lost against {baseline}</option><option value=mixed>differs in part of the seeds</option></select></label></div>
<table id=flips><thead><tr><th data-col=0>id</th><th data-col=1>question</th><th data-col=2>{system}: found (share of seeds)</th>
<th data-col=3>{baseline}: found</th><th data-col=4>Δ</th><th data-col=5>kind</th></tr></thead>
<tbody>{rows}</tbody></table>
{figure}
<script>
const q = document.getElementById('q'), kind = document.getElementById('kind'), body = document.querySelector('#flips tbody');
function apply() {{
  const words = q.value.toLowerCase().trim(), k = kind.value; let shown = 0;
  for (const row of body.rows) {{
    const ok = (!words || row.dataset.text.includes(words)) && (!k || row.dataset.kind === k);
    row.style.display = ok ? '' : 'none'; shown += ok;
  }}
  document.getElementById('shown').textContent = shown;
}}
q.addEventListener('input', apply); kind.addEventListener('change', apply);
const params = new URLSearchParams(location.hash.slice(1));
if (params.get('q')) q.value = params.get('q');
if (params.get('kind')) kind.value = params.get('kind');
apply();
for (const th of document.querySelectorAll('#flips th')) {{
  th.addEventListener('click', () => {{
    const col = +th.dataset.col, rows = [...body.rows], down = th.dataset.down !== '1';
    const key = r => {{ const t = r.cells[col].innerText; const n = parseFloat(t); return isNaN(n) ? t.toLowerCase() : n; }};
    rows.sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (down ? -1 : 1));
    th.dataset.down = down ? '1' : '0'; rows.forEach(r => body.appendChild(r));
  }});
}}
</script></body></html>
"""


def write_inspection_page(path: str | os.PathLike, *args, **kwargs) -> Path:
    text = inspection_page(*args, **kwargs)
    with atomic_open(path) as f:
        f.write(text)
    return Path(path)


def page_name(system: str, baseline: str, dataset: str, k: int) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{system}-vs-{baseline}-{dataset}-top{k}").strip("-").lower()
    return f"inspect-{slug}.html"
