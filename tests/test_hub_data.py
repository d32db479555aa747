"""The hub as a data source (taser.data.hub and its layouts), on small local datasets in each hub
layout, written by `save_to_disk` or as JSON data files (never the network): training records and
batches equal to DPR's JSON read in place, BEIR and QA evaluation equal to their file paths, the
memory-mapped Arrow copy of a DPR JSON (its checks, its cache), and the offline error."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import FIXTURES

from taser.data.arrow_training import ArrowTrainingSet, arrow_cache_path, ensure_arrow_copy, open_arrow_file
from taser.data.biencoder_json import BiEncoderJsonFile, write_biencoder_json
from taser.data.config import DataConfig, HubData
from taser.data.errors import DataFormatError
from taser.data.hub import HubDataError, HubSplit, load_split
from taser.data.passages import read_passages
from taser.data.qa import read_qa
from taser.pipeline.evaluate import RetrieverSettings, evaluate_qa, evaluate_qa_hub
from taser.pipeline.evaluate_ood import BeirHub, evaluate_beir
from taser.pipeline.training_data import open_training_data
from taser.retrieval.bm25 import BM25Settings
from taser.training.loader import StepBatches
from taser.training.sampler import MultiSetSchedule

datasets = pytest.importorskip("datasets")

BEIR = FIXTURES / "beir-tiny"
BM25S = RetrieverSettings("bm25", bm25=BM25Settings(backend="bm25s"))


@pytest.fixture(autouse=True)
def offline_cache(tmp_path, monkeypatch):
    """No test reaches the network: offline, with datasets' cache under tmp_path."""
    cache = tmp_path / "hf"
    for name, value in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(cache), "HF_DATASETS_CACHE": str(cache / "datasets")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # read at import: set where it is used
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache / "datasets")
    return cache


def _save(rows: list[dict], path, split: str | None = None):
    ds = datasets.Dataset.from_list(rows)
    (datasets.DatasetDict({split: ds}) if split else ds).save_to_disk(str(path))
    return path


def _jsonl(rows: list[dict], path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- training: DPR's layout and Tevatron's -----------------------------------------------------


def _batches(train_set, tokenizer, steps: int = 3, seed: int = 5, batch_size: int = 3) -> list:
    schedule = MultiSetSchedule([len(train_set)], batch_size, seed)
    loader = StepBatches([train_set], schedule, tokenizer, seed=seed, batch_size=batch_size, grad_accumulation=1, hard_negatives=1,
                         other_negatives=1, max_question_length=16, max_length=32, total_steps=steps)
    return [loader[k][0] for k in range(len(loader))]


def _same_batches(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for side in ("questions", "passages"):
            for key in getattr(x, side):
                assert torch.equal(getattr(x, side)[key], getattr(y, side)[key]), (side, key)
        assert torch.equal(x.positive_idx, y.positive_idx) and torch.equal(x.ctx_owner, y.ctx_owner)


def _dpr_records(mini_squad) -> list[dict]:
    records = list(BiEncoderJsonFile(mini_squad / "train.json"))[:12]
    records[1]["positive_ctxs"][0].pop("title")  # a ctx without a title, one with a score, one with an integer passage id
    records[2]["hard_negative_ctxs"] = [{"title": "T", "text": "a hard negative", "score": 3, "passage_id": 77}]
    records[3]["positive_ctxs"][0]["score"] = 12.5
    return records


def test_dpr_records_through_every_arrow_path_equal_the_json_reader(tmp_path, mini_squad, tokenizer):
    records = _dpr_records(mini_squad)
    source = tmp_path / "train.json"
    write_biencoder_json(source, records)
    in_place = BiEncoderJsonFile(source)
    hub_records = [{**r, "hard_negative_ctxs": [{**c, "passage_id": str(c.get("passage_id"))} for c in r.get("hard_negative_ctxs", [])]}
                   for r in records]  # a hub dataset's passage ids are strings (one Arrow type per column)
    sets = {
        "arrow copy": open_arrow_file(ensure_arrow_copy(source, tmp_path / "cache")),
        "save_to_disk": ArrowTrainingSet(load_split(HubSplit(str(_save(hub_records, tmp_path / "saved", "train"))), tmp_path / "hf"), "saved"),
        "JSON data files": ArrowTrainingSet(load_split(HubSplit(str(_jsonl(hub_records, tmp_path / "mirror" / "train.jsonl").parent)),
                                                       tmp_path / "hf"), "mirror"),
    }
    expected = [{**r, "hard_negative_ctxs": [{**c, "passage_id": str(c["passage_id"])} if "passage_id" in c else c
                                             for c in r.get("hard_negative_ctxs", [])]} for r in records]
    reference = _batches(in_place, tokenizer)
    for name, train_set in sets.items():
        got = list(train_set)
        if name == "arrow copy":
            assert got == expected, name  # every field, the score's 3 read back as 3.0 (equal)
        else:
            assert [r["question"] for r in got] == [r["question"] for r in records] and got == expected, name
        _same_batches(_batches(train_set, tokenizer), reference)


TEVATRON = [
    {"query_id": "1", "query": "who wrote hamlet", "answers": ["Shakespeare"],
     "positive_passages": [{"docid": "10", "title": "Hamlet", "text": "Hamlet is a tragedy written by William Shakespeare."}],
     "negative_passages": [{"docid": "11", "title": "Macbeth", "text": "Macbeth is a tragedy."},
                           {"docid": "12", "title": "Othello", "text": "Othello is a tragedy set in Venice."}]},
    {"query_id": "2", "query": "capital of france", "answers": ["Paris"],
     "positive_passages": [{"docid": "20", "title": "Paris", "text": "Paris is the capital of France."}],
     "negative_passages": [{"docid": "21", "title": "Lyon", "text": "Lyon is a city in France."}]},
    {"query_id": "3", "query": "largest planet", "answers": ["Jupiter"],
     "positive_passages": [{"docid": "30", "title": "Jupiter", "text": "Jupiter is the largest planet."},
                           {"docid": "31", "title": "Gas giant", "text": "Jupiter and Saturn are gas giants."}],
     "negative_passages": []},
    {"query_id": "4", "query": "speed of light", "answers": ["299,792 km/s"],
     "positive_passages": [{"docid": "40", "title": "Light", "text": "Light travels at 299,792 km/s in vacuum."}],
     "negative_passages": [{"docid": "41", "title": "Sound", "text": "Sound travels at 343 m/s in air."}]},
]


def _as_dpr(row: dict) -> dict:
    """Tevatron's record as DPR's, written out by hand: BM25 negatives are the hard negatives."""
    ctx = lambda p: {"title": p["title"], "text": p["text"], "passage_id": p["docid"]}  # noqa: E731
    return {"question": row["query"], "answers": row["answers"], "positive_ctxs": [ctx(p) for p in row["positive_passages"]],
            "negative_ctxs": [], "hard_negative_ctxs": [ctx(p) for p in row["negative_passages"]]}


@pytest.mark.parametrize("layout", ["save_to_disk", "JSON data files"])
def test_tevatron_layout_trains_on_the_records_and_batches_of_its_dpr_json(tmp_path, tokenizer, layout):
    if layout == "save_to_disk":
        name = _save(TEVATRON, tmp_path / "Tevatron" / "wikipedia-nq", "train")
    else:
        name = _jsonl(TEVATRON, tmp_path / "Tevatron" / "wikipedia-nq" / "train.jsonl").parent
    data = DataConfig(source="hub", hub=HubData(train=[HubSplit(str(name), None, "train")], cache_dir=str(tmp_path / "hf")))
    opened = open_training_data(data)
    dpr_json = tmp_path / "as-dpr.json"
    write_biencoder_json(dpr_json, [_as_dpr(r) for r in TEVATRON])
    assert list(opened.sets[0]) == list(BiEncoderJsonFile(dpr_json))
    _same_batches(_batches(opened.sets[0], tokenizer, batch_size=2), _batches(BiEncoderJsonFile(dpr_json), tokenizer, batch_size=2))


def test_training_on_a_hub_dataset_gives_the_losses_of_training_on_its_dpr_json(tmp_path, tiny_pretrained):
    from conftest import tiny_model_cfg

    from taser.pipeline.train import run_training

    name = _save(TEVATRON, tmp_path / "tev", "train")
    dpr_json = tmp_path / "as-dpr.json"
    write_biencoder_json(dpr_json, [_as_dpr(r) for r in TEVATRON])
    train = {"batch_size": 2, "hard_negatives": 1, "max_steps": 3, "log_every": 1, "save_every": 0, "val_max_questions": 0, "progress": False,
             "seed": 3, "precision": "fp32", "device": "cpu", "learning_rate": 1e-3}
    hub = run_training(tiny_model_cfg(tiny_pretrained), DataConfig(source="hub", hub=HubData(train=[HubSplit(str(name))], cache_dir=str(tmp_path / "hf"))),
                       train, tmp_path / "hub-run")
    files = run_training(tiny_model_cfg(tiny_pretrained), [str(dpr_json)], train, tmp_path / "json-run")
    losses = [[r["loss"] for r in run.history if "loss" in r] for run in (hub, files)]
    assert losses[0] == losses[1] and len(losses[0]) == 3


def test_a_tevatron_record_without_positives_fails_naming_the_dataset_and_record(tmp_path):
    rows = [dict(r) for r in TEVATRON]
    rows[2] = {**rows[2], "positive_passages": []}
    name = str(_save(rows, tmp_path / "tev", "train"))
    with pytest.raises(DataFormatError) as e:
        open_training_data(DataConfig(source="hub", hub=HubData(train=[HubSplit(name)], cache_dir=str(tmp_path / "hf"))))
    assert e.value.path == f"{name} (split 'train')" and e.value.where == "record 2"
    assert e.value.what == "question 'largest planet' has no positive_passages"


@pytest.mark.parametrize("broken, where, what", [
    (lambda r: r.update(question="  "), "record 1", "missing or empty 'question'"),
    (lambda r: r["negative_ctxs"].append({"title": "no text"}), "record 1, negative_ctxs", "a passage must have a 'text' string"),
])
def test_a_bad_dpr_record_in_a_hub_dataset_is_named(tmp_path, broken, where, what):
    rows = [_as_dpr(r) for r in TEVATRON]
    for r in rows:
        r["negative_ctxs"] = [{"title": "x", "text": "y"}]
    broken(rows[1])
    with pytest.raises(DataFormatError) as e:
        ArrowTrainingSet(datasets.Dataset.from_list(rows), "my/dataset")
    assert (e.value.path, e.value.where, e.value.what) == ("my/dataset", where, what)


def test_the_arrow_copy_refuses_what_the_json_reader_refuses_with_the_same_message(tmp_path):
    records = [_as_dpr(r) for r in TEVATRON]
    records[3]["positive_ctxs"] = []
    source = tmp_path / "bad.json"
    write_biencoder_json(source, records)
    with pytest.raises(DataFormatError) as in_place:
        BiEncoderJsonFile(source)
    with pytest.raises(DataFormatError) as copied:
        ensure_arrow_copy(source, tmp_path / "cache")
    assert str(copied.value) == str(in_place.value) and "record 3" in str(copied.value)
    assert not any((tmp_path / "cache").iterdir())  # nothing half-written


def test_the_arrow_copy_is_reused_while_the_json_is_unchanged_and_remade_when_it_changes(tmp_path):
    source = tmp_path / "train.json"
    write_biencoder_json(source, [_as_dpr(r) for r in TEVATRON])
    first = ensure_arrow_copy(source, tmp_path / "cache")
    made = first.stat().st_mtime_ns
    assert ensure_arrow_copy(source, tmp_path / "cache") == first and first.stat().st_mtime_ns == made
    write_biencoder_json(source, [_as_dpr(r) for r in TEVATRON[:2]])
    os.utime(source, ns=(made + 10**9, made + 10**9))
    second = ensure_arrow_copy(source, tmp_path / "cache")
    assert second != first and not first.exists() and len(open_arrow_file(second)) == 2
    assert arrow_cache_path(source).parent == tmp_path  # without a cache directory: beside the JSON


def test_a_json_rewritten_at_the_same_length_gets_a_new_arrow_copy(tmp_path):
    """Would catch the Arrow copy keyed by the JSON's size only: a JSON rewritten at the same
    length (a question edited in place) kept its stale copy, and training read the old records."""
    source = tmp_path / "train.json"
    records = [_as_dpr(r) for r in TEVATRON]
    write_biencoder_json(source, records)
    first = ensure_arrow_copy(source, tmp_path / "cache")
    size, made = source.stat().st_size, first.stat().st_mtime_ns
    edited = records[0]["question"]
    records[0]["question"] = edited[:-1] + ("X" if edited[-1] != "X" else "Y")  # one character changed: same length
    write_biencoder_json(source, records)
    os.utime(source, ns=(made + 10**9, made + 10**9))
    assert source.stat().st_size == size
    second = ensure_arrow_copy(source, tmp_path / "cache")
    assert second != first and not first.exists()
    assert open_arrow_file(second)[0]["question"] == records[0]["question"] != edited


def test_train_reader_arrow_gives_the_json_readers_records_and_workers_read_the_same(tmp_path, mini_squad):
    data = DataConfig(train_files=[str(mini_squad / "train.json")], dev_file=str(mini_squad / "dev.json"), train_reader="arrow",
                      arrow_cache_dir=str(tmp_path / "cache"))
    opened, in_place = open_training_data(data), open_training_data(DataConfig(train_files=data.train_files, dev_file=data.dev_file))
    keep = lambda r: {k: v for k, v in r.items() if k in ("question", "answers", "positive_ctxs", "negative_ctxs", "hard_negative_ctxs")}  # noqa: E731
    assert [opened.sets[0][i] for i in range(len(opened.sets[0]))] == [keep(r) for r in in_place.sets[0]]
    assert list(opened.dev) == [keep(r) for r in in_place.dev]
    loader = torch.utils.data.DataLoader(opened.sets[0], batch_size=None, num_workers=2, collate_fn=lambda r: r["question"])
    assert list(loader) == [r["question"] for r in in_place.sets[0]]  # each worker maps the file again


# --- evaluation: BEIR and QA ---------------------------------------------------------------------


def _beir_rows(name: str) -> list[dict]:
    rows = [json.loads(line) for line in (BEIR / name).read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if k != "metadata"} for r in rows]


def _qrels_rows() -> list[dict]:
    lines = (BEIR / "qrels" / "test.tsv").read_text().splitlines()[1:]
    return [{"query-id": q, "corpus-id": d, "score": int(s)} for q, d, s in (line.split("\t") for line in lines if line.strip())]


@pytest.mark.parametrize("layout", ["save_to_disk", "JSON data files"])
def test_beir_from_a_hub_dataset_equals_beirs_files(tmp_path, layout):
    mirror = tmp_path / "BeIR"
    if layout == "save_to_disk":
        _save(_beir_rows("corpus.jsonl"), mirror / "tiny" / "corpus", "corpus")
        _save(_beir_rows("queries.jsonl"), mirror / "tiny" / "queries", "queries")
        _save(_qrels_rows(), mirror / "tiny-qrels", "test")
    else:
        _jsonl(_beir_rows("corpus.jsonl"), mirror / "tiny" / "corpus" / "corpus.jsonl")
        _jsonl(_beir_rows("queries.jsonl"), mirror / "tiny" / "queries" / "queries.jsonl")
        _jsonl(_qrels_rows(), mirror / "tiny-qrels" / "test.jsonl")
    files = evaluate_beir(BM25S, BEIR, tmp_path / "files", work_dir=tmp_path / "work-files", dataset="tiny")
    hub = evaluate_beir(BM25S, BeirHub(str(mirror / "tiny"), tmp_path / "hf"), tmp_path / "hub", work_dir=tmp_path / "work-hub")
    assert hub["dataset"] == "tiny" and hub["queries"] == files["queries"] > 0
    for key in ("metrics", "top_k_curve", "documents", "summary", "identical_ids_dropped"):
        assert hub[key] == files[key], key
    for name in ("run.trec", "per_query.jsonl"):
        assert (tmp_path / "hub" / name).read_text() == (tmp_path / "files" / name).read_text()


def test_conflicting_scores_in_hub_qrels_are_refused_and_repeated_ones_kept(tmp_path):
    """Would catch a query-document pair judged twice with different scores in a hub qrels split
    silently taking the last score (BEIR's qrels TSV refuses it: `read_beir_qrels`)."""
    from taser.data.hub_beir import load_beir_hub

    rows = _qrels_rows()
    first = rows[0]

    def mirror(name: str, qrels: list[dict]) -> str:
        _jsonl(_beir_rows("corpus.jsonl"), tmp_path / name / "tiny" / "corpus" / "corpus.jsonl")
        _jsonl(_beir_rows("queries.jsonl"), tmp_path / name / "tiny" / "queries" / "queries.jsonl")
        _jsonl(qrels, tmp_path / name / "tiny-qrels" / "test.jsonl")
        return str(tmp_path / name / "tiny")

    kept = load_beir_hub(mirror("repeated", rows + [dict(first)]), cache_dir=tmp_path / "hf")  # the same judgement twice: kept
    assert kept.qrels[first["query-id"]][first["corpus-id"]] == first["score"]
    with pytest.raises(DataFormatError) as e:
        load_beir_hub(mirror("conflicting", rows + [{**first, "score": first["score"] + 1}]), cache_dir=tmp_path / "hf")
    assert e.value.where == f"record {len(rows)}"
    assert e.value.what == f"conflicting scores for ({first['query-id']!r}, {first['corpus-id']!r}): {first['score']} and {first['score'] + 1}"


def test_qa_from_a_hub_question_set_and_corpus_equals_the_tsv_path(tmp_path, mini_squad):
    passages = [{"docid": p.id, "title": p.title, "text": p.text} for p in read_passages(mini_squad / "passages.tsv")]
    qa = list(read_qa(mini_squad / "dev.qa.tsv"))
    _save(passages, tmp_path / "corpus", "train")
    # TriviaQA's shape: the answers inside a struct, reached by a dotted column name
    _jsonl([{"question": q.question, "answer": {"aliases": q.answers, "value": q.answers[0]}} for q in qa], tmp_path / "questions" / "validation.jsonl")
    hub = HubData(passages=HubSplit(str(tmp_path / "corpus")), qa=HubSplit(str(tmp_path / "questions"), None, "validation"),
                  answers_column="answer.aliases", cache_dir=str(tmp_path / "hf"), work_dir=str(tmp_path / "hub-work"))
    files = evaluate_qa(BM25S, mini_squad / "dev.qa.tsv", mini_squad / "passages.tsv", tmp_path / "files", k=20)
    from_hub = evaluate_qa_hub(BM25S, hub, tmp_path / "hub", k=20)
    assert from_hub["top_k"] == files["top_k"] and from_hub["questions"] == files["questions"] == len(qa)
    assert json.loads((tmp_path / "hub" / "retrieval.json").read_text()) == json.loads((tmp_path / "files" / "retrieval.json").read_text())
    assert from_hub["dataset"] == "questions-validation"


def test_a_question_without_answers_in_a_hub_set_is_named(tmp_path):
    from taser.data.hub_qa import load_questions

    _jsonl([{"question": "q1", "answer": ["a"]}, {"question": "q2", "answer": 5}], tmp_path / "nq" / "validation.jsonl")
    with pytest.raises(DataFormatError, match=r"record 1: answers \('answer'\) must be a list of strings"):
        load_questions(HubSplit(str(tmp_path / "nq"), None, "validation"), cache_dir=tmp_path / "hf")


# --- loading: offline, missing, mistaken ---------------------------------------------------------


def test_offline_a_dataset_not_in_the_cache_fails_naming_what_to_fetch(tmp_path):
    spec = HubSplit("BeIR/not-cached-here", "corpus", "corpus")
    with pytest.raises(HubDataError) as e:
        load_split(spec, tmp_path / "hf")
    message = str(e.value)
    assert "BeIR/not-cached-here (config 'corpus', split 'corpus') is not in the local datasets cache" in message
    assert "HF_DATASETS_OFFLINE" in message and "datasets.load_dataset('BeIR/not-cached-here', 'corpus', split='corpus')" in message
    assert e.value.__cause__ is None and e.value.__suppress_context__  # no traceback from inside datasets
    with pytest.raises(HubDataError, match="BeIR/not-cached-here-qrels .* is not in the local datasets cache"):
        evaluate_beir(BM25S, BeirHub("BeIR/not-cached-here", tmp_path / "hf"), tmp_path / "out")


def test_offline_with_the_default_cache_a_dataset_not_in_it_fails_naming_what_to_fetch(offline_cache):
    """Would catch the offline message (the hub not reached: fetch it elsewhere, with this command)
    given only when a cache directory is passed: with the default cache it must name that cache."""
    spec = HubSplit("BeIR/not-cached-here", "corpus", "corpus")
    with pytest.raises(HubDataError) as e:
        load_split(spec)
    message = str(e.value)
    assert f"BeIR/not-cached-here (config 'corpus', split 'corpus') is not in the local datasets cache ({offline_cache / 'datasets'})" in message
    assert "HF_DATASETS_OFFLINE" in message and "Fetch it where the hub can be reached" in message
    assert "datasets.load_dataset('BeIR/not-cached-here', 'corpus', split='corpus')" in message
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_a_local_copy_without_the_split_names_what_it_has(tmp_path):
    name = str(_save([{"question": "q", "answer": ["a"]}], tmp_path / "nq_open", "validation"))
    with pytest.raises(HubDataError, match="has no split 'test'; its splits: validation"):
        load_split(HubSplit(name, None, "test"))
    with pytest.raises(HubDataError, match=r"looked for .*/test\.jsonl"):
        load_split(HubSplit(str(tmp_path), None, "test"))


# --- ranks: what is made once is made by local rank 0 ----------------------------------------------


def _rank_opens(rank, world, init_file, sources, cache, out):
    import torch.distributed as dist

    from taser.pipeline import training_data
    from taser.training.distributed import DistInfo, destroy_distributed

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    converted = []
    real = training_data.ensure_arrow_copy
    training_data.ensure_arrow_copy = lambda *a, **k: (converted.append(not arrow_cache_path(a[0], a[1]).exists()), real(*a, **k))[1]
    outcome = {}
    for name, source in sources.items():
        try:
            opened = open_training_data(DataConfig(train_files=[source], train_reader="arrow", arrow_cache_dir=cache), DistInfo(rank, world, rank))
            outcome[name] = len(opened.sets[0])
        except Exception as e:  # noqa: BLE001 (the outcome is what is checked)
            outcome[name] = f"{type(e).__name__}: {e}"
    outcome["converted"] = converted
    # The library's teardown: it drops the cached preparation group first. A bare destroy_process_group() left that
    # group to interpreter shutdown, where a rank once aborted ("terminate called without an active exception", CI).
    destroy_distributed()
    (out / f"rank{rank}.json").write_text(json.dumps(outcome))


def test_local_rank_0_converts_once_and_a_failure_there_stops_every_rank(tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    write_biencoder_json(good, [_as_dpr(r) for r in TEVATRON])
    write_biencoder_json(bad, [{**_as_dpr(r), "positive_ctxs": []} for r in TEVATRON])
    torch.multiprocessing.spawn(_rank_opens, args=(2, tmp_path / "init", {"good": str(good), "bad": str(bad)}, str(tmp_path / "cache"), tmp_path),
                                nprocs=2, join=True)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["good"] == rank1["good"] == 4
    assert rank0["converted"] == [True, True] and rank1["converted"] == [False]  # rank 1 found rank 0's copy; it never tried the bad file
    assert rank0["bad"].startswith("DataFormatError: ") and "record 0" in rank0["bad"]
    assert rank1["bad"] == "RuntimeError: local rank 0 of a node failed to prepare the training data (its log says why)"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [arrow_cache_path(good, tmp_path / "cache").name]
