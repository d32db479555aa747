"""The report over seeds, end to end on synthetic runs: 2 trained systems x 3 seeds and a seedless
BM25, each with its per_query.jsonl; mean ± std and n, bootstrap intervals, significance marks
against a baseline (Holm), the note under the table, the spread in the plot; then scripts/report.py."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from taser.evaluation.comparison import StatsSettings
from taser.evaluation.report import read_runs, write_report
from taser.evaluation.topk import accuracy_from_ranks

N = 200


def write_run(root, system, ranks, seed=None, parameters=None):
    out = root / system.replace(" ", "-") / (f"seed-{seed}" if seed is not None else "run")
    out.mkdir(parents=True)
    acc = accuracy_from_ranks(ranks, [1, 5, 20, 100])
    curve = accuracy_from_ranks(ranks, range(1, 101))
    results = {"task": "qa", "dataset": "SQuAD", "name": system, "retriever": "dense" if seed is not None else "bm25", "seed": seed,
               "parameters": parameters, "questions": len(ranks), "top_k": {str(k): round(v, 2) for k, v in acc.items()},
               "top_k_curve": [round(curve[k], 2) for k in range(1, 101)], "per_query_file": "per_query.jsonl"}
    (out / "results.json").write_text(json.dumps(results))
    (out / "per_query.jsonl").write_text("".join(json.dumps({"id": str(i), "rank": r}) + "\n" for i, r in enumerate(ranks)))
    return results


@pytest.fixture
def seeded_runs(tmp_path):
    rng = np.random.default_rng(0)
    base = [1 if x < 0.5 else (3 if x < 0.8 else None) for x in rng.random(N)]
    root = tmp_path / "runs"
    figures = {}
    for seed in (1, 2, 3):
        flip = rng.random(N) < 0.05  # a few questions change with the seed
        dpr = [(2 if r == 1 else 1) if f and r is not None else r for r, f in zip(base, flip)]
        figures.setdefault("dpr", []).append(write_run(root, "dpr", dpr, seed, 45_426_432)["top_k"]["1"])
        better = [1 if rng.random() < 0.9 else r for r in base]  # wins on most questions
        figures.setdefault("taser", []).append(write_run(root, "taser", better, seed, 25_077_888)["top_k"]["1"])
    write_run(root, "BM25", base)
    return root, figures


def test_report_over_seeds_marks_significance(seeded_runs, tmp_path):
    root, figures = seeded_runs
    runs = read_runs([root])
    assert len(runs) == 7
    report = write_report(runs, tmp_path / "report", ks=(1, 5), stats=StatsSettings(baseline="dpr", resamples=2000), title="Seeds")
    text = report["markdown"]
    main_table = text.split("## Paired differences")[0]
    lines = {line.split(" | ")[0].strip("| "): [c.strip() for c in line.strip("|").split("|")[1:]] for line in main_table.splitlines()
             if line.startswith("| ") and "---" not in line}
    assert lines["system"] == ["SQuAD top-1", "SQuAD top-5", "seeds", "parameters"]
    mean, std = np.mean(figures["taser"]), np.std(figures["taser"], ddof=1)
    cell = lines["taser"][0]
    assert cell.startswith(f"{mean:.1f} ± {std:.1f} [") and cell.endswith("] †")
    assert lines["taser"][2:] == ["3", "25.1M"]
    assert lines["dpr"][0].count("±") == 1 and "†" not in lines["dpr"][0]  # the baseline is not tested against itself
    assert lines["dpr"][2] == "3"
    assert "±" not in lines["BM25"][0] and "[" in lines["BM25"][0] and "†" not in lines["BM25"][0]  # seedless: interval only
    assert lines["BM25"][2] == "–"
    comparison = report["comparison"]
    assert comparison.tests == 4  # (taser, BM25) x (top-1, top-5), corrected together
    taser1 = comparison.cells[("taser", "SQuAD", "top-1")]
    assert taser1.spread.n == 3 and taser1.spread.mean == pytest.approx(mean) and taser1.spread.std == pytest.approx(std)
    assert taser1.p_holm < 0.05 and taser1.p_holm >= taser1.p
    assert taser1.recipe.design == "paired by seed" and taser1.recipe.seeds == (1, 2, 3) and taser1.recipe_holm < 0.05  # the mark's test
    assert comparison.cells[("BM25", "SQuAD", "top-1")].p_holm > 0.05
    assert "Holm" in text and "3 training seed(s)" in text and "SQuAD: 200" in text and "sign-flip test" in text and "crossed question x seed model" in text
    assert "## Paired differences against dpr" in text
    # the plot shades the spread over seeds
    assert (tmp_path / "report" / "topk-SQuAD.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_baseline_and_duplicate_seeds(seeded_runs, tmp_path):
    root, _ = seeded_runs
    with pytest.raises(ValueError, match="baseline='nope' is none of the systems"):
        write_report(read_runs([root]), tmp_path / "r", stats=StatsSettings(baseline="nope"))
    assert not (tmp_path / "r").exists()
    dup = root / "dpr" / "seed-1-again"
    dup.mkdir()
    for f in ("results.json", "per_query.jsonl"):
        (dup / f).write_text((root / "dpr" / "seed-1" / f).read_text())
    with pytest.raises(ValueError, match="two runs of 'dpr' on 'SQuAD' with seed 1"):
        read_runs([root])


def test_report_script_with_a_baseline(seeded_runs, tmp_path):
    root, _ = seeded_runs
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "report.py"), f"runs=[{root}]", f"out_dir={out}", "baseline=dpr",
                           "resamples=999", "ks=[1]"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "†" in proc.stdout and "after Holm's correction over the table's 2 comparison(s)" in proc.stdout
    assert (out / "report.md").is_file()


def test_intervals_are_drawn_once_across_baselines(seeded_runs, monkeypatch):
    """Another baseline's comparison of the same runs takes the intervals already drawn (they do not
    depend on the baseline), and draws them again only when its settings would draw them otherwise."""
    from taser.evaluation import comparison as comparison_module
    from taser.evaluation.report import table_stats

    runs = read_runs([seeded_runs[0]])
    first = table_stats(runs, (1,), stats=StatsSettings(baseline="dpr", resamples=500))
    fresh = table_stats(runs, (1,), stats=StatsSettings(baseline="BM25", resamples=500))

    def no_draws(*a, **k):
        raise AssertionError("an interval was drawn again")

    monkeypatch.setattr(comparison_module, "bootstrap_interval", no_draws)
    reused = table_stats(runs, (1,), stats=StatsSettings(baseline="BM25", resamples=500), reuse=first)
    assert {k: c.interval for k, c in reused.cells.items()} == {k: c.interval for k, c in fresh.cells.items()}
    assert {k: c.p_holm for k, c in reused.cells.items()} == {k: c.p_holm for k, c in fresh.cells.items()}  # the tests are the new baseline's
    with pytest.raises(AssertionError, match="drawn again"):
        table_stats(runs, (1,), stats=StatsSettings(baseline="BM25", resamples=499), reuse=first)


def test_the_report_says_what_difference_it_can_see_and_what_seeds_a_difference_needs(seeded_runs, tmp_path):
    root, _ = seeded_runs
    report = write_report(read_runs([root]), tmp_path / "report", ks=(1,), stats=StatsSettings(baseline="dpr", resamples=500, seeds_for=(4.25, 8.5)))
    text = report["markdown"]
    section = text.split("## The smallest difference this table can see (against dpr)")[1].split("\n## ")[0]
    assert "| matched seeds for a recipe difference of 4.25 | matched seeds for a recipe difference of 8.5 |" in section
    row = next(line for line in section.splitlines() if line.startswith("| SQuAD top-1 |"))
    recipe, runs_only = (float(c.split()[0]) for c in row.split("|")[2:4])
    taser = report["comparison"].cells[("taser", "SQuAD", "top-1")]
    assert recipe == pytest.approx(taser.recipe.detectable(0.05, 0.8), abs=0.051) and "(3 seeds)" in row
    assert 0 < runs_only  # over questions alone
    from taser.evaluation.recipes import detectable_at_any_seeds, seeds_needed

    needed = [c.strip() for c in row.strip("|").split("|")[3:5]]
    floor = detectable_at_any_seeds(taser.recipe.components)
    assert seeds_needed(taser.recipe.components, 4.25) is None and floor > 4.25 and needed[0] == f"none (floor {math.ceil(floor * 10) / 10:.1f})"
    assert needed[1] == str(seeds_needed(taser.recipe.components, 8.5)) and int(needed[1]) > 3  # the targets sit where the count changes
    assert "no difference larger than about this" in section


def test_the_mark_rests_on_the_recipe_test_not_on_the_test_of_these_runs(tmp_path):
    """Would catch a † from the test over questions alone for seeded systems: here taser's seeds land
    far apart (its luck with each seed), so these runs differ from dpr's (significant over 2,000
    questions) but the recipe is not shown to."""
    rng = np.random.default_rng(3)
    n = 2000
    root = tmp_path / "runs"
    for seed, shift in ((1, 0.12), (2, -0.04), (3, 0.10)):
        base = rng.random(n)
        write_run(root, "dpr", [1 if x < 0.5 else None for x in base], seed)
        write_run(root, "taser", [1 if x < 0.5 + shift else None for x in base], seed)
    report = write_report(read_runs([root]), tmp_path / "report", ks=(1,), stats=StatsSettings(baseline="dpr", resamples=500))
    cell = report["comparison"].cells[("taser", "SQuAD", "top-1")]
    assert cell.p_holm < 1e-6 and cell.recipe.p > 0.05 and not cell.significant
    taser_line = next(line for line in report["markdown"].splitlines() if line.startswith("| taser |"))
    assert "†" not in taser_line
    assert "(recipe p=" in report["markdown"] and "runs p=" in report["markdown"]


def test_a_recipe_against_a_seedless_baseline_counts_the_recipes_seeds(tmp_path):
    """Would catch a trained recipe tested against BM25 or zero-shot over questions alone: its seeds
    scatter, so the recipe test (a fixed reference against the recipe's seeds) is far more
    cautious than the test of these runs."""
    rng = np.random.default_rng(5)
    n = 2000
    root = tmp_path / "runs"
    base = rng.random(n)
    write_run(root, "BM25", [1 if x < 0.5 else None for x in base])
    for seed, shift in ((1, 0.12), (2, -0.04), (3, 0.10)):
        write_run(root, "taser", [1 if x < 0.5 + shift else None for x in base], seed)
    report = write_report(read_runs([root]), tmp_path / "report", ks=(1,), stats=StatsSettings(baseline="BM25", resamples=500))
    cell = report["comparison"].cells[("taser", "SQuAD", "top-1")]
    assert cell.recipe.design == "unpaired, against a seedless system" and cell.recipe.seeds == (3, 1)
    assert cell.p_holm < 1e-6 and cell.recipe.p > 0.05 and not cell.significant


# -- the tables of differences and of detectable differences, on three recipes against a seeded baseline --
TABLE_IDS = [f"q{i}" for i in range(20)]
TABLE_LUCK = {1: set(TABLE_IDS[10:]), 2: set(TABLE_IDS[10:13]), 3: set(TABLE_IDS[10:16])}  # a seed's luck, shared by every recipe
# each recipe: the questions it wins at every seed, and those it wins at seed 1, 2, 3 only (its own luck with the seed)
RECIPES = {"X": (TABLE_IDS[:4], {1: [], 2: [], 3: ["q4"]}),
           "Y": (TABLE_IDS[:4], {1: ["q4", "q5"], 2: [], 3: ["q4"]}),
           "Z": (TABLE_IDS[:3], {1: ["q4", "q5", "q6", "q7"], 2: [], 3: ["q4"]})}


def _table_run(system, seed, hits):
    from taser.evaluation.runs import RunResult

    records = [{"id": q, "rank": 1 if q in hits else None} for q in TABLE_IDS]
    return RunResult(system, "D", top_k={"1": 100.0 * len(hits) / len(TABLE_IDS)}, seed=seed, path=f"{system}/seed-{seed}/results.json",
                     per_query=records)


@pytest.fixture(scope="module")
def three_recipes():
    """Baseline B (hits q9 and its seed's luck) and recipes X, Y, Z at seeds 1-3, with 3 recipe tests
    in the one column (top-1): the Holm family and the median over systems have 3 members."""
    from taser.evaluation.comparison import compare

    runs = [_table_run("B", s, {"q9"} | TABLE_LUCK[s]) for s in (1, 2, 3)]
    for name, (always, own) in RECIPES.items():
        runs += [_table_run(name, s, {"q9"} | set(always) | set(own[s]) | TABLE_LUCK[s]) for s in (1, 2, 3)]
    settings = StatsSettings(baseline="B", resamples=1000, bootstrap=False, seeds_for=(24.0, 28.0))
    return runs, compare(runs, [("D", "top-1")], settings)


def _table_rows(table: str) -> dict[str, list[str]]:
    return {line.strip("|").split("|")[0].strip(): [c.strip() for c in line.strip("|").split("|")[1:]]
            for line in table.splitlines() if line.startswith("| ") and "---" not in line}


def test_the_differences_table_prints_the_recipes_holm_adjusted_p(three_recipes):
    """Would catch the differences table printing a recipe test's raw p as its Holm-adjusted one:
    three recipe tests in the table, adjusted by hand (Holm: the smallest of 3 p-values times 3, the
    next times 2, at least the one before), each printed and marked from its adjusted p."""
    import re

    from taser.evaluation.difference_tables import differences_table

    runs, comparison = three_recipes
    cells = {s: comparison.cells[(s, "D", "top-1")] for s in RECIPES}
    assert all(c.recipe is not None and c.recipe.design == "paired by seed" for c in cells.values())
    order = sorted(RECIPES, key=lambda s: cells[s].recipe.p)
    adjusted, running = {}, 0.0
    for i, s in enumerate(order):
        running = max(running, min(1.0, (3 - i) * cells[s].recipe.p))
        adjusted[s] = running
    rows = _table_rows(differences_table(runs, comparison, ks=(1,)))
    assert set(rows) == {"system", "X", "Y", "Z"}
    for s in RECIPES:
        printed = re.search(r"recipe p=([0-9.e-]+)", rows[s][0]).group(1)
        assert printed == f"{adjusted[s]:.2g}" != f"{cells[s].recipe.p:.2g}", (s, rows[s])
        assert rows[s][0].endswith("†") == (adjusted[s] < 0.05), (s, rows[s])
    assert sum(p < 0.05 for p in adjusted.values()) == 1 and all(c.recipe.p < 0.05 for c in cells.values())  # the raw p would mark all three


def test_the_detectable_table_prints_the_median_over_systems_not_the_smallest(three_recipes):
    """Would catch the table of detectable differences printing the smallest recipe (or runs)
    detectable difference, or the fewest seeds needed, over the systems instead of their median:
    the three recipes' figures are far enough apart that each column's median and minimum differ."""
    from scipy.stats import norm

    from taser.evaluation.difference_tables import detectable_table, seeds_needed_cell
    from taser.evaluation.recipes import seeds_needed

    runs, comparison = three_recipes
    cells = [comparison.cells[(s, "D", "top-1")] for s in RECIPES]
    recipe = sorted(c.recipe.detectable(0.05, 0.8) for c in cells)
    these_runs = sorted((norm.ppf(0.975) + norm.ppf(0.8)) * c.runs_se for c in cells)
    needed = {t: sorted(seeds_needed_cell(c.recipe.components, t, "top-1", 0.05, 0.8) for c in cells) for t in (24.0, 28.0)}
    counts = sorted(seeds_needed(c.recipe.components, 28.0) for c in cells)  # every system reaches 28 points
    assert [n[1] for n in needed[28.0]] == [str(n) for n in counts]
    shown = {t: n[1][1] for t, n in needed.items()}
    smallest = {t: n[0][1] for t, n in needed.items()}
    # the medians: each differs from the smallest as printed
    assert f"{recipe[1]:.1f}" != f"{recipe[0]:.1f}" and f"{these_runs[1]:.1f}" != f"{these_runs[0]:.1f}"
    assert all(shown[t] != smallest[t] for t in shown), (shown, smallest)
    row = _table_rows(detectable_table(runs, comparison, ks=(1,)))["D top-1"]
    assert row == [f"{recipe[1]:.1f} (3 seeds)", f"{these_runs[1]:.1f}", shown[24.0], shown[28.0]]


# -- the detectable difference at the level the mark is decided at (issue 45) -----------------------
def test_the_detectable_difference_is_given_at_each_marks_holm_level(three_recipes):
    """Would catch the detectable difference (and the seeds it needs) given only at the table's alpha,
    before Holm's correction, while each mark is decided at its step of Holm's procedure: the i-th
    smallest of the 3 recipe p-values meets alpha / (3 - i + 1), and each system's row gives the
    difference its recipe test detects at that level."""
    from taser.evaluation.difference_tables import detectable_table, seeds_needed_cell

    runs, comparison = three_recipes
    cells = {s: comparison.cells[(s, "D", "top-1")] for s in RECIPES}
    order = sorted(RECIPES, key=lambda s: cells[s].recipe.p)
    text = detectable_table(runs, comparison, ks=(1,))
    at_holm = text.split("The same at the level each mark is decided at")[0].split("nothing of other seeds.")[1]
    rows = _table_rows(at_holm)
    assert set(rows) == {"system", "X", "Y", "Z"}
    stopped = None
    for rank, s in enumerate(order):
        level = 0.05 / (3 - rank)
        if stopped is None and cells[s].recipe.p > level:
            stopped = level  # Holm stops here: this comparison and every later one had to beat this level
        level = level if stopped is None else stopped
        assert cells[s].recipe_level == pytest.approx(level)
        mdd = cells[s].recipe.detectable(level, 0.8)
        need = [seeds_needed_cell(cells[s].recipe.components, t, "top-1", level, 0.8)[1] for t in (24.0, 28.0)]
        assert rows[s] == [f"{mdd:.1f} at α {level:.2g}; seeds for 24/28: " + "/".join(need)]
        unadjusted = f"{cells[s].recipe.detectable(0.05, 0.8):.1f}"
        assert (f"{mdd:.1f}" != unadjusted) if level < 0.05 else (f"{mdd:.1f}" == unadjusted)  # a stricter level asks for more
    assert stopped is not None  # the fixture holds a comparison Holm does not reject: its level is where Holm stopped


def test_a_table_against_a_seedless_baseline_gives_the_recipes_detectable_difference(tmp_path):
    """Would catch the recipe test's detectable difference printed as "–" against BM25 or zero-shot,
    where every mark rests on it: the recipe's seeds against a fixed reference give a figure, and
    seeds-needed, in both tables."""
    from taser.evaluation.recipes import seeds_needed

    rng = np.random.default_rng(7)
    n = 400
    root = tmp_path / "runs"
    base = rng.random(n)
    write_run(root, "BM25", [1 if x < 0.4 else None for x in base])
    for seed, shift in ((1, 0.05), (2, 0.02), (3, 0.04)):
        write_run(root, "taser", [1 if x < 0.45 + shift * rng.random() else None for x in base], seed)
    report = write_report(read_runs([root]), tmp_path / "report", ks=(1,), stats=StatsSettings(baseline="BM25", resamples=500, seeds_for=(1.0, 2.0)))
    cell = report["comparison"].cells[("taser", "SQuAD", "top-1")]
    assert cell.recipe.design == "unpaired, against a seedless system" and cell.recipe.components is not None
    section = report["markdown"].split("## The smallest difference this table can see (against BM25)")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("| SQuAD top-1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == f"{cell.recipe.detectable(0.05, 0.8):.1f} (3 seeds)"
    from taser.evaluation.difference_tables import seeds_needed_cell

    assert cells[3:] == [seeds_needed_cell(cell.recipe.components, t, "top-1", 0.05, 0.8)[1] for t in (1.0, 2.0)]
    from taser.evaluation.recipes import detectable_at_any_seeds

    floor = detectable_at_any_seeds(cell.recipe.components)
    assert seeds_needed(cell.recipe.components, 2.0) is None and cells[3:] == [f"none (floor {math.ceil(floor * 10) / 10:.1f})"] * 2 and floor > 2.0
    taser = next(line for line in section.splitlines() if line.startswith("| taser |"))
    assert f"{cell.recipe.detectable(0.05, 0.8):.1f} at α 0.05" in taser  # the only test of its family: Holm's level is alpha


def test_the_delta_printed_is_the_delta_the_recipe_test_tested(tmp_path):
    """Would catch the differences table printing the difference of all seeds' means while the recipe
    test pairs a 3-seed row with the baseline's seeds 1-3 only: here the baseline's seeds 4 and 5 are
    far lower (another machine), so the tested Δ (+5.0) and the all-seed one (+15.0) differ; both are
    printed, the tested one first, and a row whose seeds all match prints one Δ."""
    import re

    from taser.evaluation.comparison import compare
    from taser.evaluation.difference_tables import differences_table

    ids = TABLE_IDS
    base_hits = {1: set(ids[:10]), 2: set(ids[:10]), 3: set(ids[:10]), 4: set(ids[:5]), 5: set(ids[:5])}
    runs = [_table_run("B", s, base_hits[s]) for s in base_hits]
    runs += [_table_run("A", s, set(ids[:11])) for s in (1, 2, 3)]  # one question more than B at seeds 1-3
    runs += [_table_run("C", s, set(ids[:11])) for s in base_hits]  # all five seeds
    comparison = compare(runs, [("D", "top-1")], StatsSettings(baseline="B", resamples=500, bootstrap=False))
    a, c = comparison.cells[("A", "D", "top-1")], comparison.cells[("C", "D", "top-1")]
    assert c.recipe.seeds == (1, 2, 3, 4, 5) and c.recipe.delta == pytest.approx(c.delta)
    assert a.recipe.seeds == (1, 2, 3) and a.recipe.delta == pytest.approx(5.0) and a.delta == pytest.approx(55.0 - 40.0)
    rows = _table_rows(differences_table(runs, comparison, ks=(1,)))
    assert rows["A"][0].startswith("+5.0 (seeds 1, 2, 3; all seeds: +15.0) (recipe p="), rows["A"]
    assert re.match(r"\+15\.0 \(recipe p=", rows["C"][0]) and "all seeds" not in rows["C"][0], rows["C"]


def test_a_run_reads_the_machine_its_results_record(tmp_path):
    """The report's machine check reads the CPU kind, device and precision each results.json records."""
    from taser.evaluation.runs import read_run

    results = write_run(tmp_path, "dpr", [1, None, 2], seed=1)
    path = tmp_path / "dpr" / "seed-1" / "results.json"
    assert read_run(path).machine is None  # recorded no hardware
    hardware = {"cpu": "AMD EPYC", "cpu_capability": "AVX512", "cpu_native_bf16": True, "device": "cpu"}
    path.write_text(json.dumps({**results, "hardware": hardware, "precision": "fp32"}))
    assert read_run(path).machine == "AMD EPYC (AVX512, native bf16), cpu, fp32"
    path.write_text(json.dumps({**results, "hardware": hardware, "precision": "bf16"}))
    assert read_run(path).machine == "AMD EPYC (AVX512, native bf16), cpu, bf16"
    gpu = {"cpu": "Intel Xeon", "cpu_capability": "AVX2", "cpu_native_bf16": False, "device": "cuda"}
    path.write_text(json.dumps({**results, "hardware": gpu, "precision": "bf16"}))
    assert read_run(path).machine == "Intel Xeon (AVX2, no native bf16), cuda, bf16"
    older = {k: v for k, v in gpu.items() if k != "device"}  # records written before the device was
    path.write_text(json.dumps({**results, "hardware": older, "precision": "fp32"}))
    assert read_run(path).machine == "Intel Xeon (AVX2, no native bf16), cpu, fp32"
    for nothing in ({}, "AMD EPYC"):
        path.write_text(json.dumps({**results, "hardware": nothing, "precision": "fp32"}))
        assert read_run(path).machine is None


def test_a_floor_just_above_the_target_is_printed_above_it():
    """Would catch "none (floor 1.0)" for a target of 1: the floor is rounded up at the cell's decimals."""
    from taser.evaluation.difference_tables import seeds_needed_cell
    from taser.evaluation.recipes import Components, detectable_at_any_seeds

    components = Components(seed=0.0, question=137.5, residual=900.0, seeds=3, questions=1000)
    floor = detectable_at_any_seeds(components)
    assert 1.0 < floor < 1.05
    assert seeds_needed_cell(components, 1.0, "EM@1", 0.05, 0.8)[1] == "none (floor 1.1)"
    assert seeds_needed_cell(components, 1.1, "EM@1", 0.05, 0.8)[1].isdigit()  # above the floor: a count


def test_the_median_system_of_seeds_needed_ranks_counts_then_too_many_then_none():
    """Would catch the detectable table's median over systems ranking "none (floor X)" (no number of
    seeds) below a count or "> 200" (more than the search tried): three systems, one of each."""
    from taser.evaluation.difference_tables import seeds_needed_cell
    from taser.evaluation.recipes import Components

    count = Components(seed=0.0, question=50.0, residual=900.0, seeds=3, questions=1000)
    too_many = Components(seed=0.0, question=119.5, residual=5000.0, seeds=3, questions=1000)  # floor 0.97: 600-odd seeds
    none = Components(seed=0.0, question=400.0, residual=900.0, seeds=3, questions=1000)
    cells = sorted(seeds_needed_cell(c, 1.0, "top-20", 0.05, 0.8) for c in (none, too_many, count))
    assert [text for _, text in cells][0].isdigit() and [text for _, text in cells][1:] == ["> 200", "none (floor 1.8)"]


def test_the_statistics_say_how_far_they_are(seeded_runs, caplog, monkeypatch):
    """A study's intervals and recipe tests run for minutes: the log gets a line at the start, at least every
    30 s while they run, and at the end, with the cells done of those to do."""
    import taser.progress
    from taser.evaluation.comparison import compare

    monkeypatch.setattr(taser.progress, "on_terminal", lambda stream=None: False)
    root, _ = seeded_runs
    runs = read_runs([root])
    with caplog.at_level("INFO", logger="taser.progress"):
        compare(runs, [("SQuAD", "top-1"), ("SQuAD", "top-5")], StatsSettings(baseline="dpr", resamples=200))
    lines = [r.getMessage() for r in caplog.records if r.name == "taser.progress"]
    assert lines[0].startswith("statistics against dpr: 0/6 ") and lines[-1].startswith("statistics against dpr: 6/6 ")  # 3 systems x 2 columns
