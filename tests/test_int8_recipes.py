"""The study that chose `openvino_int8`'s recipe (benchmarks/peers/int8_recipes.py): its rule, which
candidate the report names as the library's, and the committed report regenerated from its record."""

import json

import pytest
from conftest import ROOT, load_script


@pytest.fixture(scope="module")
def study():
    return load_script(ROOT / "benchmarks" / "peers" / "int8_recipes.py", "int8_recipes")


def _row(model, candidate, moved, kept):
    return {"model": model, "candidate": candidate, "selection_moved": moved, "float_products": kept, "gate_moved": 0, "gate_discordant": 0}


def test_the_rule_takes_the_fewest_moved_first_hits_over_both_models(study):
    rows = [_row("dpr", "a", 300, 0), _row("taser", "a", 300, 0), _row("dpr", "b", 200, 2), _row("taser", "b", 340, 2)]
    assert study.rule_pick(rows) == "b"  # 540 against 600: more than 2% fewer


def test_within_two_percent_the_rule_takes_fewer_products_in_float(study):
    rows = [_row("dpr", "few", 306, 2), _row("taser", "few", 300, 2), _row("dpr", "many", 300, 4), _row("taser", "many", 300, 4)]
    assert study.rule_pick(rows) == "few"  # 606 <= 1.02 x 600
    rows[0]["selection_moved"] = 313  # 613 > 612
    assert study.rule_pick(rows) == "many"


def test_the_committed_report_is_its_record_and_names_the_librarys_recipe(study):
    from taser.models.openvino_backend import FLOAT_MATMULS, SMOOTH_QUANT_ALPHA

    record = json.loads((ROOT / "benchmarks" / "peers" / "int8_recipes.json").read_text())
    text = study.report(record)
    assert text == (ROOT / "benchmarks" / "peers" / "int8_recipes.md").read_text()
    ours = [name for name, (alpha, pattern) in study.CANDIDATES.items() if (alpha, pattern) == (SMOOTH_QUANT_ALPHA, FLOAT_MATMULS.pattern)]
    assert len(ours) == 1 and f"| {ours[0]} (chosen) |" in text
    assert f"The rule picks **{ours[0]}**; `openvino_int8` uses **{ours[0]}**." in text  # the library follows its own study
