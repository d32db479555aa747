"""`backend=auto` per CPU kind: the fastest backend that passed the accuracy gate on the record of this
CPU kind; on an unrecorded kind the fastest exact backend over the recorded kinds; the reason logged;
a backend chosen by hand that did not pass says why."""

import pytest

from taser.models import backend_choice, backends
from taser.models.backend_choice import CpuKind, gate_of, record_for
from taser.models.backend_choice import choose as choose_with

EPYC = CpuKind("AMD EPYC", "AVX512", True)


def choose(kind, installed, kinds=None):
    return choose_with(kind, installed, backends.recipe_versions(), kinds)


def _entry(cpu="AMD EPYC", capability="AVX512", native_bf16=True, **speeds):
    """A record of one CPU kind, each backend's verdict on its current recipe."""
    recipe = {str(b): version for b, (_, version) in backends.RECIPES.items()}
    return {"cpu": cpu, "capability": capability, "native_bf16": native_bf16, "date": "2026-12-05", "source": "encode_results.md",
            "backends": {b: {"passages_per_s": p, "questions_per_s": q, "gate": gate, **({"recipe": recipe[b]} if b in recipe else {})}
                         for b, (p, q, gate) in speeds.items()}}


KINDS = (
    _entry(torch=(40, 400, "passes"), onnx=(80, 800, "passes"), openvino=(100, 900, "passes"),
           openvino_int8=(160, 1500, "undecided: dpr top-1: 8895 questions detect only losses >= 0.61 point (bound 0.5)"),
           onnx_int8=(85, 850, "fails: taser top-1 loss 0.76 point >= bound 0.5")),
    _entry(cpu="Intel Xeon", capability="AVX2", native_bf16=False, torch=(20, 200, "passes"), onnx=(50, 500, "passes"), openvino=(40, 450, "passes")),
)


def test_a_recorded_kind_takes_its_fastest_backend_that_passed():
    chosen, why = choose(EPYC, lambda b: True, KINDS)
    assert chosen == "openvino"
    assert "fastest backend that passed the accuracy gate on AMD EPYC (AVX512, native bf16) (100 passages/s, 900 questions/s" in why
    assert "faster but not taken: openvino_int8 undecided" in why and "onnx_int8" not in why  # slower than openvino: not worth naming
    assert choose(EPYC, lambda b: b != "openvino", KINDS)[0] == "onnx"  # the fastest installed one
    chosen, why = choose(EPYC, lambda b: b == "torch", KINDS)
    assert chosen == "torch" and "openvino not installed" in why and "onnx not installed" in why
    # the kind is the model name, the instruction set and native bf16 together
    assert record_for(CpuKind("AMD EPYC", "AVX2", True), KINDS) is None and record_for(CpuKind("AMD EPYC", "AVX512", False), KINDS) is None


def test_an_int8_backend_that_passed_is_taken_when_fastest():
    passed = (_entry(torch=(40, 400, "passes"), openvino=(100, 900, "passes"), openvino_int8=(160, 1500, "passes")),)
    assert choose(EPYC, lambda b: True, passed)[0] == "openvino_int8"


def test_an_unrecorded_kind_takes_the_fastest_exact_backend_over_the_recorded_kinds():
    arm = CpuKind("Neoverse-V2", "DEFAULT", False)
    chosen, why = choose(arm, lambda b: True, KINDS)
    # speed-up over torch: onnx 2.0x and 2.5x (median 2.25), openvino 2.5x and 2.0x (2.25): a tie kept in record order; int8 never
    assert chosen in ("onnx", "openvino") and "no record for Neoverse-V2 (DEFAULT, no native bf16)" in why and "2.25x" in why
    faster_onnx = KINDS[:1] + (_entry(cpu="Intel Xeon", capability="AVX2", native_bf16=False, torch=(20, 200, "passes"), onnx=(80, 500, "passes"),
                                      openvino=(40, 450, "passes")),)
    assert choose(arm, lambda b: True, faster_onnx)[0] == "onnx"  # medians 3.0x against 2.25x
    assert choose(arm, lambda b: b == "torch", KINDS)[0] == "torch"
    assert choose(arm, lambda b: True, ())[0] == "torch"


def test_the_shipped_record_is_read_and_names_its_source():
    entry = record_for(EPYC)
    assert entry is not None and entry["source"] == "benchmarks/peers/encode_results.md"
    assert all(b in {str(x) for x in backends.Backend} for b in entry["backends"])
    assert gate_of("torch", EPYC, backends.recipe_versions()) == "passes" and gate_of("onnx", EPYC, backends.recipe_versions()) == "passes"
    assert gate_of("onnx_int8_static", EPYC, backends.recipe_versions()).startswith("fails")


def test_auto_logs_its_choice_and_a_hand_chosen_backend_that_did_not_pass_says_why(monkeypatch, caplog):
    monkeypatch.setattr(backend_choice, "records", lambda: KINDS)
    monkeypatch.setattr(backend_choice, "this_cpu", lambda: EPYC)
    monkeypatch.setattr(backends, "installed", lambda b: True)
    monkeypatch.setattr(backends, "_SAID", set())
    caplog.set_level("INFO")
    assert backends.resolve_backend("auto", "cpu") == backends.Backend.openvino
    assert "backend=auto -> openvino: the fastest backend that passed" in caplog.text
    assert backends.resolve_backend("auto", "cpu") == backends.Backend.openvino
    assert caplog.text.count("backend=auto ->") == 1  # a run resolves at each stage; it says so once
    assert backends.resolve_backend("auto", "cuda") == backends.Backend.torch
    caplog.clear()
    assert backends.resolve_backend("onnx", "cpu") == backends.Backend.onnx and "accuracy gate" not in caplog.text
    assert backends.resolve_backend("onnx_int8", "cpu") == backends.Backend.onnx_int8
    assert "backend=onnx_int8 did not pass the accuracy gate recorded for AMD EPYC (AVX512, native bf16): fails: taser top-1" in caplog.text
    caplog.clear()
    assert backends.resolve_backend("onnx_int8_qkv", "cpu") == backends.Backend.onnx_int8_qkv
    assert "has no accuracy-gate verdict recorded for AMD EPYC" in caplog.text
    with pytest.raises(ValueError, match="runs on the CPU only"):
        backends.resolve_backend("openvino", "cuda")


def test_torch_needs_no_verdict_and_a_record_without_it_still_falls_back_to_it():
    only_torch = (_entry(torch=(40, 400, "reference"), openvino_int8=(160, 1500, "fails: dpr top-1 loss 0.6 point >= bound 0.5"),
                         onnx_int8=(40, 300, "undecided: too few questions")),)
    chosen, why = choose(EPYC, lambda b: True, only_torch)
    assert chosen == "torch" and "(40 passages/s, 400 questions/s" in why
    assert why.endswith("faster but not taken: openvino_int8 fails") and "onnx_int8" not in why  # as fast is not faster
    without_torch = (_entry(openvino_int8=(160, 1500, "fails: a loss")),)
    chosen, why = choose(EPYC, lambda b: True, without_torch)
    assert chosen == "torch" and "no backend recorded for AMD EPYC (AVX512, native bf16) passed the accuracy gate" in why


def test_an_unrecorded_kind_ranks_by_speed_up_among_the_installed_and_skips_records_without_torch():
    arm = CpuKind("Neoverse-V2", "DEFAULT", False)
    kinds = (_entry(torch=(10, 100, "passes"), onnx=(20, 200, "passes"), openvino=(40, 300, "passes")),
             _entry(cpu="No torch", onnx=(500, 5000, "passes")))  # no torch figure: no speed-up to read
    chosen, why = choose(arm, lambda b: True, kinds)
    assert chosen == "openvino" and "4.00x torch's passages/s" in why
    assert choose(arm, lambda b: b != "openvino", kinds)[0] == "onnx"
    # the shipped record, read when no records are given
    chosen, why = choose(arm, lambda b: True)
    assert chosen in backend_choice.EXACT and f"the {len(backend_choice.records())} recorded CPU kind(s)" in why


def test_the_reason_names_exactly_the_faster_backends_not_taken_and_why():
    kinds = (_entry(torch=(40, 400, "passes"), onnx=(80, 800, "passes"), openvino=(100, 900, "passes"), onnx_int8_qkv=(80, 900, "passes"),
                    openvino_int8=(160, 1500, "undecided: dpr top-1: 8895 questions detect only losses >= 0.61 point (bound 0.5)"),
                    onnx_int8=(85, 850, "fails: taser top-1 loss 0.76 point >= bound 0.5")),)
    chosen, why = choose(EPYC, lambda b: b not in ("openvino", "onnx_int8_qkv"), kinds)
    assert chosen == "onnx" and why.endswith("; faster but not taken: openvino_int8 undecided, onnx_int8 fails, openvino not installed")
    passed = (_entry(torch=(40, 400, "passes"), openvino_int8=(160, 1500, "passes")),)
    assert choose(EPYC, lambda b: True, passed)[1].endswith("questions/s; encode_results.md, 2026-12-05)")  # nothing faster: nothing added
    recipes = backends.recipe_versions()
    assert gate_of("openvino_int8", EPYC, recipes, kinds).startswith("undecided: dpr top-1") and gate_of("openvino_bf16", EPYC, recipes, kinds) is None
    assert gate_of("torch", EPYC, backends.recipe_versions(), (_entry(torch=(40, 400, "reference")),)) == "passes"  # the reference needs no verdict


def test_a_verdict_on_another_recipe_of_the_backend_is_not_this_recipes():
    kinds = (_entry(torch=(40, 400, "passes"), onnx=(80, 800, "passes"), openvino_int8=(160, 1500, "passes")),)
    kinds[0]["backends"]["openvino_int8"]["recipe"] = backends.RECIPES[backends.Backend.openvino_int8][1] - 1  # judged before a change
    chosen, why = choose(EPYC, lambda b: True, kinds)
    assert chosen == "onnx" and why.endswith("faster but not taken: openvino_int8 not judged")
    current = backends.RECIPES[backends.Backend.openvino_int8][1]
    expected = f"not judged: the record judged recipe {current - 1}, this version makes recipe {current}"
    assert gate_of("openvino_int8", EPYC, backends.recipe_versions(), kinds) == expected
    del kinds[0]["backends"]["onnx"]["recipe"]  # a record that names no recipe: not judged either
    assert choose(EPYC, lambda b: True, kinds)[0] == "torch"


def test_a_recorded_speed_without_a_verdict_is_not_judged():
    from taser.models.backend_choice import verdict

    assert verdict("onnx", {"passages_per_s": 80, "recipe": 3}, {"onnx": 3}) == "not judged"
    assert verdict("onnx", {"passages_per_s": 80, "recipe": 3, "gate": "passes"}, {"onnx": 3}) == "passes"


def test_auto_skips_a_recorded_name_this_version_lacks_and_a_backend_not_installed(monkeypatch):
    future = (_entry(torch=(40, 400, "passes"), onnx=(80, 800, "passes"), openvino=(100, 900, "passes")),)
    future[0]["backends"]["tensorrt_cpu"] = {"passages_per_s": 500, "questions_per_s": 5000, "gate": "passes", "recipe": 1}
    monkeypatch.setattr(backend_choice, "records", lambda: future)
    monkeypatch.setattr(backend_choice, "this_cpu", lambda: EPYC)
    monkeypatch.setattr(backends, "installed", lambda b: b != backends.Backend.openvino)
    assert backends.resolve_backend("auto", "cpu") == backends.Backend.onnx  # not the unknown name, not openvino (absent)
    with pytest.raises(ValueError, match="^unknown backend 'openvino_int4'; expected one of auto, torch"):
        backends.resolve_backend("openvino_int4", "cpu")
