"""A page to inspect why two systems differ: one self-contained HTML file (no server, no external
file) for a system against its baseline on one dataset.

- a summary: each system's figure (mean over its seeds), the difference, the test of these runs
  and, where both have several seeds, the recipe test (`taser.evaluation.comparison`), with the
  family its Holm correction runs over and whether that is the family of the report beside it;
- the questions that flipped at k: found (an answer in the first k passages) by one system and
  missed by the other, as a fraction of each system's seeds; sortable by any column and filtered by
  text and by kind (gained, lost, mixed); each row opens on the question, its gold answers, the
  rank at which each seed first found an answer, the passage the question was written from (where
  the data says so: SQuAD) and both systems' first passages (of their first seed) where a
  `retrieval.json` lies beside the run's `results.json`;
- the report's top-k curve, embedded, when it was drawn.

The texts come from the runs themselves and from the data they name (`runs_data`): a
`retrieval.json` beside `results.json` (questions, answers, retrieved passages); else the QA file
and passages the run's `results.json` names (`qa_file`, `passages`, `squad_json`), else the data of
the table preset that evaluates the run's dataset (`configs/table/*.yaml`: the committed ablation
runs, `benchmarks/ablations/runs/`, are the SQuAD dev split of `data/squad/`). A recorded path is
tried as given, under the repository, the current directory and the run's directories. Only the
questions and passages shown are kept: a QA file or passages TSV is streamed once, after the ids
needed are known (DPR's 21M passages never sit in memory). When texts are missing, one warning at
the top of the page (and one in the log) says which file was looked for where, and how to get it.
The filter can also be set from the address (`page.html#q=word&kind=lost`), so a link opens on a given view.
"""

from __future__ import annotations

import base64
import html
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from taser.evaluation.comparison import Comparison
from taser.evaluation.inspect_texts import PASSAGES_SHOWN, Texts, fill_ctx_texts, retrieval_records, runs_data
from taser.evaluation.per_query import metric_values
from taser.evaluation.runs import RunResult
from taser.io import atomic_open

log = logging.getLogger(__name__)


def page_metric(runs: Sequence[RunResult], k: int) -> str:
    """What a page compares at k: a reader's exact match (EM@k) when every run is a reader's, else top-k."""
    return f"EM@{k}" if runs and all(r.task == "reader" for r in runs) else f"top-{k}"


def _hits(runs: Sequence[RunResult], metric: str) -> dict[str, float]:
    """Question id -> the fraction of the runs (seeds) that find an answer in the first k passages
    (`top-k`), or whose reader answers it exactly (`EM@k`)."""
    total: dict[str, float] = {}
    for run in runs:
        values = metric_values(run.per_query, metric)
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
        text = _highlight(str(ctx["text"]), answers) if ctx.get("text") else f"<i>passage {html.escape(str(ctx.get('id')))}: text unknown</i>"
        items.append(f"<li><b>{flag} {rank}. {html.escape(str(ctx.get('title', '')))}</b> {text}</li>")
    return "<ol class=passages>" + "".join(items) + "</ol>"


def _ranks(runs: Sequence[RunResult], by_run: Sequence[dict[str, int | None]], qid: str) -> str:
    """'3 (seed 1), – (seed 2)': the rank of each seed's first passage with an answer."""
    return ", ".join(f"{'–' if m.get(qid) is None else m[qid]}" + (f" (seed {r.seed})" if r.seed is not None else "")
                     for r, m in zip(runs, by_run))


def _kind(mine: float, theirs: float) -> str:
    """gained: found by the system at every seed and by the baseline at none; lost: the reverse; mixed: the rest."""
    if mine == 1 and theirs == 0:
        return "gained"
    if mine == 0 and theirs == 1:
        return "lost"
    return "mixed"


def inspection_page(system_runs: Sequence[RunResult], baseline_runs: Sequence[RunResult], k: int, comparison: Comparison | None = None,
                    plot: str | os.PathLike | None = None, report_columns: Sequence[tuple[str, str]] | None = None,
                    said: set[str] | None = None) -> str:
    """The page's HTML: `system_runs` (its seeds) against `baseline_runs` on one dataset at top-k.
    `report_columns`: the (dataset, metric) columns of the report the page goes with, so that the
    page can say whether its tests' family is the report's; `said`: warnings already logged (by the
    other pages of one report), not logged again."""
    system, baseline = system_runs[0].system, baseline_runs[0].system
    dataset = system_runs[0].dataset
    if any(r.per_query is None for r in [*system_runs, *baseline_runs]):
        raise ValueError(f"inspecting {system} against {baseline} needs every run's per_query.jsonl")
    metric = page_metric([*system_runs, *baseline_runs], k)
    mine, theirs = _hits(system_runs, metric), _hits(baseline_runs, metric)
    said_mine, said_theirs = _predictions(system_runs[0], k), _predictions(baseline_runs[0], k)
    if set(mine) != set(theirs):
        raise ValueError(f"{system} and {baseline} were evaluated on different questions")
    flipped = [(qid, int(qid) if qid.isdigit() else position)
               for position, qid in enumerate(str(r["id"]) for r in system_runs[0].per_query) if mine[qid] != theirs[qid]]
    needed = {index for _, index in flipped}
    retrieved_mine, retrieved_theirs = retrieval_records(system_runs[0], needed), retrieval_records(baseline_runs[0], needed)
    covered = set(retrieved_mine or ()) | set(retrieved_theirs or ())
    covered |= {i for p in (said_mine, said_theirs) if p is not None for i in needed if i < len(p)}  # a reader's predictions.json names its questions
    texts = runs_data([*system_runs, *baseline_runs], needed, len(system_runs[0].per_query)) if needed - covered else Texts()
    fill_ctx_texts([*(retrieved_mine or {}).values(), *(retrieved_theirs or {}).values()], [*system_runs, *baseline_runs], texts)
    ranks_mine = [{str(r["id"]): r.get("rank") for r in run.per_query} for run in system_runs]
    ranks_theirs = [{str(r["id"]): r.get("rank") for r in run.per_query} for run in baseline_runs]
    lists = retrieved_mine is not None or retrieved_theirs is not None
    rows = []
    for qid, index in flipped:
        rec_mine = (retrieved_mine or {}).get(index)
        rec_theirs = (retrieved_theirs or {}).get(index)
        known = texts.questions.get(index)
        record = rec_mine or rec_theirs or next((p[index] for p in (said_mine, said_theirs) if p is not None and index < len(p)), {})
        question = record.get("question") or (known.question if known else f"question {qid}")
        answers = [str(a) for a in (record.get("answers") or (known.answers if known else []))]
        kind = _kind(mine[qid], theirs[qid])
        detail = (f"<div class=detail><p><b>Answers:</b> {html.escape(' | '.join(answers)) or '–'}</p>"
                  f"<p><b>First passage with an answer, rank by seed</b> ({html.escape(system)}: "
                  f"{_ranks(system_runs, ranks_mine, qid)}; {html.escape(baseline)}: {_ranks(baseline_runs, ranks_theirs, qid)})</p>")
        if said_mine is not None or said_theirs is not None:
            detail += (f"<p><b>Predicted answer</b> (first seed): {html.escape(system)}: {_said(said_mine, index)}; "
                       f"{html.escape(baseline)}: {_said(said_theirs, index)}</p>")
        gold = texts.passages.get(known.gold) if known and known.gold else None
        if gold is not None:
            detail += (f"<div class=gold><h4>The passage the question was written from</h4><p><b>{html.escape(gold.title)}</b> "
                       f"{_highlight(gold.text, answers)}</p></div>")
        if lists:
            detail += (f"<div class=cols><div><h4>{html.escape(system)}</h4>{_passages(rec_mine, answers, k)}</div>"
                       f"<div><h4>{html.escape(baseline)}</h4>{_passages(rec_theirs, answers, k)}</div></div>")
        rows.append(f"<tr class=row data-kind={kind} data-text=\"{html.escape(question.lower())}\"><td>{html.escape(qid)}</td>"
                    f"<td><details><summary>{html.escape(question)}</summary>{detail}</div></details></td>"
                    f"<td>{mine[qid]:.2f}</td><td>{theirs[qid]:.2f}</td><td>{mine[qid] - theirs[qid]:+.2f}</td><td>{kind}</td></tr>")
    warning = ""
    if texts.problems:
        why = "; ".join(texts.problems) + (". Rows without a question text show its id." if needed - covered - set(texts.questions) else ".")
        warning = f"<div class=warning role=alert><b>Texts missing.</b> {html.escape(why)}</div>"
        message = f"texts missing on the inspection page of {system} against {baseline} on {dataset}: {why}"
        if said is None or why not in said:  # the pages of one report over the same data warn once
            log.warning("%s", message)
            if said is not None:
                said.add(why)
    source = texts.source + ("" if lists or not needed else
                             " Neither run kept its retrieved passages (a retrieval.json beside its results.json): each question shows "
                             + ("the passage it was written from and " if texts.passages else "")
                             + "the rank at which each seed first found an answer instead.")
    summary = _summary(system_runs, baseline_runs, metric, comparison, mine, theirs, report_columns)
    if source.strip():
        summary += f"<p class=texts>{html.escape(source.strip())}</p>"
    figure = ""
    if plot and Path(plot).is_file():
        encoded = base64.b64encode(Path(plot).read_bytes()).decode()
        figure = f"<h2>Top-k accuracy</h2><img alt='top-k accuracy curves' src='data:image/png;base64,{encoded}'>"
    title = f"{system} against {baseline} on {dataset}, {metric}"
    outcome = "answered exactly" if metric.startswith("EM@") else "found"
    return _PAGE.format(title=html.escape(title), warning=warning, summary=summary, rows="".join(rows), count=len(rows), figure=figure,
                        system=html.escape(system), baseline=html.escape(baseline), metric=metric, outcome=outcome)


def _predictions(run: RunResult, k: int) -> list[dict] | None:
    """Per question of a reader run, {question, answers, prediction at k} from the `predictions.json`
    beside its results.json (`scripts/read.py`, a reader row); None for other runs or without the file."""
    path = Path(run.path).parent / "predictions.json" if run.path and run.task == "reader" else None
    if path is None or not path.is_file():
        return None
    import json

    return [{"question": p.get("question"), "answers": p.get("answers"),
             "prediction": str(p.get("by_k", {}).get(str(k), {}).get("prediction", p.get("prediction", "")))}
            for p in json.loads(path.read_text(encoding="utf-8"))]


def _said(predictions: list[dict] | None, index: int) -> str:
    if predictions is None or index >= len(predictions):
        return "<i>not kept</i>"
    answer = predictions[index]["prediction"]
    return f"<q>{html.escape(answer)}</q>" if answer else "<i>no answer</i>"


def _family(comparison: Comparison, metric: str, dataset: str, report_columns: Sequence[tuple[str, str]] | None) -> str:
    """Which comparisons the page's Holm corrections run over, and whether that is the report's family."""
    tested = [key for key, c in comparison.cells.items() if c.p_holm is not None]
    recipes = [key for key, c in comparison.cells.items() if c.recipe_holm is not None]
    if not tested:
        return ""
    systems = list(dict.fromkeys(s for s, _, _ in tested))
    datasets = list(dict.fromkeys(d for _, d, _ in tested))
    columns = list(dict.fromkeys(m if len(datasets) == 1 else f"{d} {m}" for _, d, m in tested))
    text = (f"<p class=family><b>Family.</b> Holm's correction runs over the comparisons against {html.escape(str(comparison.settings.baseline))} "
            f"of the report's table: {len(tested)} for the test of these runs ({len(systems)} system(s) × {html.escape(', '.join(columns))}"
            f"{'' if len(datasets) > 1 else ' on ' + html.escape(datasets[0])})"
            + (f" and {len(recipes)} for the recipe test" if recipes else "") + ". ")
    if report_columns is not None:
        mine = (dataset, metric)
        in_report = [key for key in tested if key[1:] in set(report_columns)]
        if mine in set(report_columns):
            text += "It is the family of report.md beside this page: the adjusted p-values here are those of its table of differences. "
        else:
            shown = ", ".join(m for d, m in report_columns if d == dataset) or "none"
            text += (f"<b>It is not report.md's family</b>: {metric} is not a column of report.md beside this page ({html.escape(shown)}), so "
                     f"this page tested it beside the report's columns: {len(tested)} comparisons here, {len(in_report)} in report.md, and the "
                     f"adjusted p-values differ (add {metric.split('@')[-1].removeprefix('top-')} to the report's ks=[...] for one family). ")
    return text + ("An adjusted p depends on its family: the same comparison in another table (over other systems or columns, such as "
                   "a results.md of a whole study) gets another; the unadjusted p does not.</p>")


def _summary(system_runs, baseline_runs, metric, comparison, mine, theirs, report_columns=None) -> str:
    n = len(mine)
    a, b = sum(mine.values()) / n * 100, sum(theirs.values()) / n * 100
    gained = sum(1 for q in mine if _kind(mine[q], theirs[q]) == "gained" and mine[q] != theirs[q])
    lost = sum(1 for q in mine if _kind(mine[q], theirs[q]) == "lost" and mine[q] != theirs[q])
    lines = [f"<tr><td>{html.escape(system_runs[0].system)}</td><td>{a:.1f}</td><td>{len(system_runs)}</td></tr>",
             f"<tr><td>{html.escape(baseline_runs[0].system)}</td><td>{b:.1f}</td><td>{len(baseline_runs)}</td></tr>"]
    tests = ""
    cell = comparison.cells.get((system_runs[0].system, system_runs[0].dataset, metric)) if comparison else None
    if cell is not None and cell.p is not None:
        tests = f"<p>Δ {cell.delta:+.2f}; these runs: p = {cell.p:.2g} ({cell.p_method}), Holm {cell.p_holm:.2g}"
        if cell.recipe is not None:
            tests += (f"; the recipe ({cell.recipe.design}, seeds {', '.join(map(str, cell.recipe.seeds))}): Δ {cell.recipe.delta:+.2f}, "
                      f"p = {cell.recipe.p:.2g}, Holm {cell.recipe_holm:.2g}, detectable at 80% power: {cell.recipe.detectable():.2f}"
                      f" (at its Holm level α {cell.recipe_level:.2g}: {cell.recipe.detectable(cell.recipe_level):.2f})")
        tests += ".</p>" + _family(comparison, metric, system_runs[0].dataset, report_columns)
    outcome = "answered exactly" if metric.startswith("EM@") else "found"
    return (f"<table class=summary><tr><th>system</th><th>{metric}</th><th>seeds</th></tr>{''.join(lines)}</table>{tests}"
            f"<p>{n:,} questions: {gained} {outcome} by {html.escape(system_runs[0].system)} only at every seed, {lost} by "
            f"{html.escape(baseline_runs[0].system)} only; the rest of the rows below differ in part of the seeds.</p>")


_PAGE = """<!DOCTYPE html>
<html lang=en><head><meta charset=utf-8><title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; }} th, td {{ border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ cursor: pointer; background: #f4f4f4; }} mark {{ background: #ffe066; }} .cols {{ display: flex; gap: 2em; }}
.cols > div {{ flex: 1; }} .passages li {{ margin-bottom: .4em; }} #controls {{ margin: 1em 0; }}
.warning {{ background: #fff3cd; border: 1px solid #d9a400; padding: .6em 1em; margin: 1em 0; }} .gold {{ background: #f6f8fa; padding: 0 .8em; }}
</style></head><body>
<h1>{title}</h1>
{warning}
{summary}
<h2>Questions that flipped at {metric} (<span id=shown>{count}</span> of {count} shown)</h2>
<div id=controls><label>Filter: <input id=q type=search placeholder="words of the question"></label>
<label>Kind: <select id=kind><option value="">all</option><option value=gained>gained by {system}</option>
<option value=lost>lost against {baseline}</option><option value=mixed>differs in part of the seeds</option></select></label></div>
<table id=flips><thead><tr><th data-col=0>id</th><th data-col=1>question</th><th data-col=2>{system}: {outcome} (share of seeds)</th>
<th data-col=3>{baseline}: {outcome}</th><th data-col=4>Δ</th><th data-col=5>kind</th></tr></thead>
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


def page_name(system: str, baseline: str, dataset: str, metric: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{system}-vs-{baseline}-{dataset}-{metric.replace('-', '').replace('@', '')}").strip("-").lower()
    return f"inspect-{slug}.html"
