"""CPU encoding, taser's backends against sentence-transformers' backends, side by side (issue 22),
and the accuracy gate that decides what `backend=auto` may pick (issue 35).

    make peers-fast-env                             # once: sentence-transformers with its onnx/openvino extras
    python benchmarks/peers/encode.py               # 3 rounds of every setting, ~70 min on 2 cores
    python benchmarks/peers/encode.py --rounds 1 --limit 256   # a quick look
    python benchmarks/peers/encode.py --accuracy-only          # the gate alone: taser's backends, trained models
    python benchmarks/peers/encode.py --taser-speed-only       # taser's backends alone, side by side (no peers, no gate)

Speed: the shipped all-MiniLM-L6-v2 (mean pooling, unit vectors) encodes the SQuAD protocol's
2,141 passages and every shipped question (the 7,010 training questions of the first 30 articles
and the 1,971 evaluation questions, 8,981) in every setting: taser's backends (`torch`, `onnx`,
`onnx_int8`, `onnx_int8_static`, `onnx_int8_qkv`, `openvino`, `openvino_int8`, and where the CPU has
native bf16 `openvino_bf16` and `openvino_int8_bf16`) and sentence-transformers' own CPU backends (`benchmarks/peers/st_encode.py`: torch, onnx, onnx
O3, onnx int8, openvino, openvino int8, each built with its own helpers, in its own environment).
Same texts, batch 64, max 256 tokens, the threads each library takes by default (all cores).
Each setting is its own process (peak memory is its own); a round runs every setting once, and
rounds repeat in the same order, so each setting's median is over rounds spread across the run.
64 passages are encoded once before timing (sessions warm up, threads spin up); loading and
exporting are timed apart from encoding.

Accuracy and the gate (`taser.evaluation.encoding_gate`; the rule: docs/encoding.md, "The accuracy
gate"): a trained `dpr` and `taser` (T=2) in each taser backend, against taser's `torch`, per
question: top-1 and top-20 on all 8,981 shipped questions (exact search over the vectors, DPR's
answer match), and nDCG@10 on `squad-beir`, a BEIR-format set written from the same files (the
2,141 passages; one query per question with a gold passage; that passage relevant). The gate asks
whether two encoders of the same model agree, not how well the model generalises, so the training
questions serve as well as the evaluation ones. The accuracy table gives top-1/5/20/100 and nDCG@10
on the evaluation questions alone, the zero-shot MiniLM in every setting that ran, and each
setting's median cosine to its library's torch vectors; the zero-shot vectors of every setting are
also judged against their own library's `torch` (the speed table's gate column for the peers).
`--accuracy-only` runs the trained models in taser's backends alone and keeps the file's speed
section from its run.

A run with speed rounds and the gate writes this CPU kind's entry of `taser/models/backend_speeds.json`
(each taser backend's median speeds and its verdict), which `backend=auto` reads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import BASE_TRAIN, ROOT, command_line, machine_line, peak_rss_gb, prepare_squad_with_bm25  # noqa: E402

TASER_BACKENDS = ("torch", "onnx", "onnx_int8", "onnx_int8_static", "onnx_int8_qkv", "openvino", "openvino_bf16", "openvino_int8",
                  "openvino_int8_bf16")
PEER_SETTINGS = ("torch", "onnx", "onnx-O3", "onnx-int8", "openvino", "openvino-int8")
MINILM = {"model_type": "shared", "pretrained": "shipped:all-MiniLM-L6-v2", "pooling": "auto", "normalize": "auto"}
TRAINED = {
    "dpr": {**MINILM, "model_type": "dpr"},
    "taser": {**MINILM, "model_type": "taser", "taser": {"specialize_every": 2, "specialize": "ffn", "routing": "deterministic", "num_experts": 2}},
}
GATED_MODELS = ("dpr", "taser")
SPLITS = ("train", "dev")  # the shipped questions: the training articles' and the evaluation articles'; the gate reads both
GATED_METRICS = ("top-1", "top-20", "nDCG@10")
SPEED, TASER_SPEED, ACCURACY, NOTES = "## Speed", "## taser's backends side by side", "## Accuracy and the gate", "## What limits the speed"
SECTIONS = (SPEED, TASER_SPEED, ACCURACY, NOTES)  # in the file's order; a section this run does not write is kept from the earlier file


# -- the data and models --------------------------------------------------------------------------


def write_squad_beir(data_dir: Path, out: Path) -> Path:
    """`squad-beir`, a BEIR-format set from the protocol's files in `data_dir` (`prepare_squad`):
    corpus.jsonl: every passage of passages.tsv; queries.jsonl and qrels/test.tsv: one query per
    question with a gold passage (train.json's and dev.json's records), its id `<split>-<i>` with i
    the question's 0-based position in `<split>.qa.tsv`, that passage relevant."""
    from taser.data.json_stream import iter_json_array
    from taser.data.passages import read_passages
    from taser.data.qa import read_qa

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for passage in read_passages(data_dir / "passages.tsv"):
            f.write(json.dumps({"_id": passage.id, "title": passage.title, "text": passage.text}, ensure_ascii=False) + "\n")
    rows = []
    for split in SPLITS:
        questions = [x.question for x in read_qa(data_dir / f"{split}.qa.tsv")]
        position = 0
        for record in iter_json_array(data_dir / f"{split}.json"):  # the QA file's questions in order, those without a gold passage left out
            while questions[position] != record["question"]:
                position += 1
            rows.append((f"{split}-{position}", record["question"], record["positive_ctxs"][0]["passage_id"]))
            position += 1
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid, question, _ in rows:
            f.write(json.dumps({"_id": qid, "text": question}, ensure_ascii=False) + "\n")
    (out / "qrels").mkdir(exist_ok=True)
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{qid}\t{pid}\t1\n" for qid, _, pid in rows))
    return out


def squad_beir(data_dir: Path, passages: list, qa: list, offsets: dict[str, int], counts: dict[str, int]) -> dict:
    """The `squad-beir` set, read back with taser's BEIR reader, as rows of the benchmark's question
    vectors (`qa`: each split's questions from `offsets[split]`, `counts[split]` of them):
    {"queries": ids, "rows": each query's question row, "evaluation": whether it is an evaluation
    question, "qrels", "passage_ids"}; with `--limit`, the queries whose question and gold passage
    are both within the limit."""
    from taser.data.beir import beir_files, read_beir_corpus, read_beir_split

    files = beir_files(write_squad_beir(data_dir, data_dir / "squad-beir"))
    corpus_ids = [p.id for p in read_beir_corpus(files.corpus)][: len(passages)]
    if corpus_ids != [p.id for p in passages]:
        raise SystemExit("squad-beir's corpus is not passages.tsv in its order")
    queries, qrels = read_beir_split(files)
    known = set(corpus_ids)
    kept, rows = [], []
    for qid in queries:
        split, position = qid.rsplit("-", 1)
        if int(position) < counts[split] and set(qrels[qid]) <= known:
            row = offsets[split] + int(position)
            if queries[qid] != qa[row].question:
                raise SystemExit(f"squad-beir's query {qid} is not {split}.qa.tsv's question {position}")
            kept.append(qid)
            rows.append(row)
    return {"queries": kept, "rows": rows, "evaluation": [qid.startswith("dev-") for qid in kept], "qrels": {qid: qrels[qid] for qid in kept},
            "passage_ids": corpus_ids}


def prepare(args) -> dict:
    """Texts (in files both environments read), the `squad-beir` set, and the checkpoints taser's settings load."""
    from taser.data.json_stream import iter_json_array
    from taser.data.passages import read_passages
    from taser.data.qa import read_qa
    from taser.models.inputs import passage_string
    from taser.pipeline.experiment import save_initial
    from taser.pipeline.train import run_training

    data = prepare_squad_with_bm25(args.work)
    data_dir = Path(data["passages"]).parent
    texts = args.work / "texts"
    texts.mkdir(parents=True, exist_ok=True)
    passages = list(read_passages(data["passages"]))[: args.limit]
    by_split = {split: list(read_qa(data_dir / f"{split}.qa.tsv"))[: args.limit] for split in SPLITS}  # every shipped question
    qa = [x for split in SPLITS for x in by_split[split]]
    offsets = {split: sum(len(by_split[s]) for s in SPLITS[: SPLITS.index(split)]) for split in SPLITS}
    train = list(itertools.islice(iter_json_array(data["train_files"][0]), 150))
    calibration = [r["question"] for r in train] + [passage_string(p["title"], p["text"], "[SEP]") for r in train for p in r["positive_ctxs"][:1]]
    for name, values in {
        "passages": [passage_string(p.title, p.text, "[SEP]") for p in passages], "questions": [x.question for x in qa],
        "calibration": calibration,
        # taser tokenises a passage as the pair (title, text): its children read these instead
        "passages.pairs": [(p.title, p.text) for p in passages],
    }.items():
        (texts / f"{name}.json").write_text(json.dumps(values))
    for stale in ("beir-corpus", "beir-queries"):  # an earlier version's tiny BEIR fixture: the peers' script encodes it when present
        (texts / f"{stale}.json").unlink(missing_ok=True)
    zero_shot = args.work / "models" / "zero-shot" / "initial"
    if not zero_shot.is_dir():
        save_initial(MINILM, zero_shot.parent)
    models = {"zero-shot": zero_shot}
    for name, model_cfg in TRAINED.items():
        given = getattr(args, name)
        if given:
            models[name] = Path(given)
            continue
        out = args.work / "models" / name
        if not (out / "final" / "model.safetensors").is_file():
            train_cfg = {**BASE_TRAIN, "batch_size": 16, "max_steps": args.train_steps, "warmup_steps": max(1, args.train_steps // 10), "seed": 1}
            run_training(model_cfg, data["train_files"], train_cfg, out)
        models[name] = out / "final"
    return {"texts": texts, "models": {k: str(v) for k, v in models.items()}, "passages": passages, "qa": qa,
            "evaluation_rows": list(range(offsets["dev"], offsets["dev"] + len(by_split["dev"]))), "counts": {s: len(by_split[s]) for s in SPLITS},
            "beir": squad_beir(data_dir, passages, qa, offsets, {s: len(by_split[s]) for s in SPLITS})}


# -- one taser run (a child process of this script) ---------------------------------------------


def taser_child(args) -> dict:
    import numpy as np
    import torch

    from taser.data.passages import Passage
    from taser.models.encoding import encode_passages, encode_questions
    from taser.models.loading import load_checkpoint

    texts = args.texts

    def read(name):
        return json.loads((texts / f"{name}.json").read_text())

    def as_passages(name):
        return [Passage(str(i), text, title) for i, (title, text) in enumerate(read(name))]

    start = time.perf_counter()
    model, tokenizer = load_checkpoint(args.checkpoint, device="cpu", backend=args.child)
    load_s = time.perf_counter() - start
    passages, questions = as_passages("passages.pairs"), read("questions")
    kw = {"batch_size": args.batch, "precision": "fp32"}
    encode_passages(model, tokenizer, passages[:64], **kw)
    start = time.perf_counter()
    p = encode_passages(model, tokenizer, passages, **kw)
    passage_s = time.perf_counter() - start
    start = time.perf_counter()
    q = encode_questions(model, tokenizer, questions, **kw)
    question_s = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / "passages.npy", p)
    np.save(args.out / "questions.npy", q)
    return {"library": "taser", "setting": args.child, "load_s": load_s, "passage_s": passage_s, "question_s": question_s,
            "passages_per_s": len(passages) / passage_s, "questions_per_s": len(questions) / question_s, "peak_rss_gb": peak_rss_gb(),
            "threads": torch.get_num_threads()}


def run_child(library: str, setting: str, model: str, out: Path, args, texts: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if library == "taser":
        cmd = [sys.executable, __file__, "--child", setting, "--checkpoint", model]
    else:
        cmd = [str(args.peer_python), str(HERE / "st_encode.py"), "--setting", setting, "--model", model, "--work", str(args.work / "st-exports")]
    cmd += ["--texts", str(texts), "--out", str(out), "--batch", str(args.batch)]
    if library != "taser":
        cmd += ["--max-length", str(args.max_length)]
    made = {"library": library, "setting": setting, "model": str(Path(model).resolve()), "texts": texts_digest(texts)}
    record = out / "made.json"  # what the vectors in `out` were made from: --reuse-vectors reuses only the same
    if getattr(args, "reuse_vectors", False) and record.is_file() and (out / "passages.npy").is_file():
        kept = json.loads(record.read_text())
        if kept["made"] == made:
            return {**kept["result"], "reused": True}
    record.unlink(missing_ok=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{library} {setting} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    record.write_text(json.dumps({"made": made, "result": result}))
    return result


def texts_digest(texts: Path) -> str:
    """A digest of the texts the children encode (a --limit run's are not a full run's)."""
    import hashlib

    digest = hashlib.sha1()
    for name in ("passages.pairs", "questions"):
        digest.update((texts / f"{name}.json").read_bytes())
    return digest.hexdigest()


# -- accuracy -------------------------------------------------------------------------------------


class AnswerCache:
    """DPR's answer match of (question, passage), computed once: the settings' top-100s overlap."""

    def __init__(self, qa, passages):
        self.qa, self.passages, self.known = qa, passages, {}

    def __call__(self, qi: int, pi: int) -> bool:
        from taser.evaluation.answers import has_answer

        key = (qi, pi)
        if key not in self.known:
            self.known[key] = has_answer(self.qa[qi].answers, self.passages[pi].text, "string")
        return self.known[key]


def accuracy(out: Path, answers: AnswerCache, prepared: dict) -> tuple[dict, dict]:
    """(figures, per-question outcomes) of the vectors in `out`: top-k (DPR's answer match) and
    nDCG@10 per query on `squad-beir` (the same vectors: its corpus is the protocol's passages, its
    queries the questions with a gold passage). The figures are of the evaluation questions; the
    outcomes, which the gate reads, of every question."""
    import numpy as np

    from taser.evaluation.ir_metrics import per_query_metrics
    from taser.evaluation.per_query import metric_values, qa_records
    from taser.evaluation.topk import accuracy_from_ranks

    p, q = np.load(out / "passages.npy"), np.load(out / "questions.npy")
    top = np.argsort(-(q @ p.T), axis=1, kind="stable")[:, :100]
    ranks = [next((r + 1 for r, pi in enumerate(row) if answers(qi, int(pi))), None) for qi, row in enumerate(top)]  # lazily: stops at the first hit
    evaluation = prepared["evaluation_rows"]
    scores = {f"top{k}": value for k, value in accuracy_from_ranks([ranks[i] for i in evaluation], (1, 5, 20, 100)).items()}
    records = qa_records([str(i) for i in range(len(ranks))], ranks)
    outcomes = {metric: metric_values(records, metric) for metric in GATED_METRICS if metric.startswith("top-")}
    beir = prepared["beir"]
    scores["ndcg10"] = float("nan")
    if not beir["queries"]:  # --limit: no question within it has its gold passage within it
        return scores, outcomes
    sims = q[beir["rows"]] @ p.T
    ids = beir["passage_ids"]
    run = {qid: [(ids[j], float(sims[i, j])) for j in np.argsort(-sims[i], kind="stable")[:10]] for i, qid in enumerate(beir["queries"])}
    per_query = per_query_metrics(run, beir["qrels"], ks=(10,))
    outcomes["nDCG@10"] = np.array([per_query[qid]["nDCG@10"] for qid in beir["queries"]])
    on_evaluation = outcomes["nDCG@10"][np.asarray(beir["evaluation"], dtype=bool)]
    scores["ndcg10"] = float(on_evaluation.mean()) if len(on_evaluation) else float("nan")
    return scores, outcomes


def median_cosine(a: Path, b: Path) -> float:
    import numpy as np

    x, y = np.load(a / "passages.npy"), np.load(b / "passages.npy")
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    return float(np.median(cos))


# -- the report -----------------------------------------------------------------------------------


def joined(values, spec: str = ".1f") -> str:
    return ", ".join(format(v, spec) for v in values)


def fmt_setting(library: str, setting: str) -> str:
    return f"{library} `{setting}`"


def run_line(args) -> str:
    """Which run a section comes from: its command, machine (CPU, instruction set, cores; lscpu's
    model name and torch's CPU capability), precision, libraries and date."""
    import datetime

    import onnxruntime
    import openvino
    import torch

    machine = machine_line("fp32").removeprefix("Machine: ").rstrip(".")
    return (f"From `{command_line(__file__)}` on {datetime.date.today().isoformat()}: {machine} (CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}), encoding in fp32 except where a backend's name says int8 or bf16, "
            f"onnxruntime {onnxruntime.__version__}, openvino {openvino.__version__.split('-')[0]}.")


def speed_section(args, prepared: dict, speed: list[dict], versions: str, gate_column: dict | None = None) -> str:
    """`gate_column`: (library, setting) -> its verdict, printed in the table."""
    gate_column = gate_column or {}
    rows = ["| setting | passages/s (median) | questions/s (median) | per round (passages/s) | peak RSS GB | load s | export s | gate |",
            "|---|---|---|---|---|---|---|---|"]
    by_setting: dict[tuple, list[dict]] = {}
    for r in speed:
        by_setting.setdefault((r["library"], r["setting"]), []).append(r)
    medians = {}
    for key, runs in by_setting.items():
        p = statistics.median(r["passages_per_s"] for r in runs)
        q = statistics.median(r["questions_per_s"] for r in runs)
        medians[key] = (p, q)
        export = max(r.get("export_s", 0.0) for r in runs)
        rows.append(f"| {fmt_setting(*key)} | {p:.1f} | {q:.0f} | {joined(r['passages_per_s'] for r in runs)} | "
                    f"{statistics.median(r['peak_rss_gb'] for r in runs):.2f} | {statistics.median(r['load_s'] for r in runs):.1f} | {export:.0f} | "
                    f"{gate_column.get(key, '')} |")
    peers = {k: v for k, v in medians.items() if k[0] == "sentence-transformers"}
    best_p = max(peers.items(), key=lambda kv: kv[1][0]) if peers else None
    best_q = max(peers.items(), key=lambda kv: kv[1][1]) if peers else None
    ratio = ["", "| taser setting | passages/s vs the fastest sentence-transformers | questions/s vs the fastest | passages/s per round vs that setting |",
             "|---|---|---|---|"]
    for key, (p, q) in medians.items():
        if key[0] != "taser" or not best_p:
            continue
        per_round = []
        for mine, theirs in zip(by_setting[key], by_setting[best_p[0]]):
            per_round.append(mine["passages_per_s"] / theirs["passages_per_s"])
        ratio.append(f"| `{key[1]}` | {p / best_p[1][0]:.2f}x (vs {fmt_setting(*best_p[0])}) | {q / best_q[1][1]:.2f}x (vs {fmt_setting(*best_q[0])}) | "
                     f"{joined(per_round, '.2f')} |")
    return (f"{SPEED}\n\n{run_line(args)}\n\n{args.rounds} rounds; {len(prepared['passages'])} passages, {len(prepared['qa'])} questions, "
            f"batch {args.batch}, max {args.max_length} tokens. Peer: {versions}\n\n" + "\n".join(rows + ratio)
            + "\n\nRatios are of medians over rounds; above 1 is taser faster. The gate column: taser's backends, the verdict on "
            "the trained `dpr` and `taser` (the accuracy section); sentence-transformers' settings, the same rule on the zero-shot "
            "MiniLM against its own `torch` (three checks).\n")


def taser_speed_section(args, prepared: dict, speed: list[dict]) -> str:
    """taser's backends alone, each against taser's `torch` and `onnx_int8` of the same run, round by round."""
    by_setting: dict[str, list[dict]] = {}
    for r in speed:
        by_setting.setdefault(r["setting"], []).append(r)
    medians = {s: (statistics.median(r["passages_per_s"] for r in runs), statistics.median(r["questions_per_s"] for r in runs))
               for s, runs in by_setting.items()}
    rows = ["| setting | passages/s (median) | questions/s (median) | per round (passages/s) | per round (questions/s) | vs `torch` "
            "(passages, questions) | vs `onnx_int8` (passages, questions) | median cosine to `torch` | peak RSS GB | load s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for setting, runs in by_setting.items():
        p, q = medians[setting]
        versus = [f"{p / medians[b][0]:.2f}x, {q / medians[b][1]:.2f}x" if b in medians else "" for b in ("torch", "onnx_int8")]
        cosine = (median_cosine(args.work / "vectors" / "zero-shot" / "taser" / "torch", args.work / "vectors" / "zero-shot" / "taser" / setting)
                  if "torch" in medians else float("nan"))
        per_round = f"{joined(r['passages_per_s'] for r in runs)} | {joined((r['questions_per_s'] for r in runs), '.0f')}"
        rss, load = statistics.median(r["peak_rss_gb"] for r in runs), statistics.median(r["load_s"] for r in runs)
        rows.append(f"| `{setting}` | {p:.1f} | {q:.0f} | {per_round} | {versus[0]} | {versus[1]} | {cosine:.5f} | {rss:.2f} | {load:.1f} |")
    return (f"{TASER_SPEED}\n\n{run_line(args)}\n\n{args.rounds} rounds of taser's backends alone (no peer ran: for the ratio to "
            f"sentence-transformers, see the speed section's run); the zero-shot MiniLM; {len(prepared['passages'])} passages, "
            f"{len(prepared['qa'])} questions, batch {args.batch}. Each setting its own process; a round runs every setting once, in "
            f"the same order. Vectors of the last round.\n\n" + "\n".join(rows) + "\n\nRatios are of medians over rounds.\n")


def accuracy_section(args, prepared: dict, acc: dict, verdicts: list) -> str:
    from taser.evaluation.encoding_gate import GateSettings, describe, verdict_table

    outcome = {v.backend: v.outcome for v in verdicts}
    acc_rows = ["| model | setting | top-1 | top-5 | top-20 | top-100 | nDCG@10 (squad-beir) | median cosine to torch | gate |",
                "|---|---|---|---|---|---|---|---|---|"]
    for (model, library, setting), a in acc.items():
        gated = library == "taser" and setting != "torch" and model in GATED_MODELS
        acc_rows.append(f"| {model} | {fmt_setting(library, setting)} | {a['top1']:.1f} | {a['top5']:.1f} | {a['top20']:.1f} | {a['top100']:.1f} | "
                        f"{a['ndcg10']:.4f} | {a['cosine']:.5f} | {outcome.get(setting, '') if gated else ''} |")
    beir = prepared["beir"]
    trained = ", ".join(f"`{name}` {getattr(args, name) or f'trained here ({args.train_steps} steps, precision auto)'}" for name in TRAINED)
    evaluation = sum(beir["evaluation"])
    return (f"{ACCURACY}\n\n{run_line(args)} The trained models: {trained}.\n\n"
            f"The table: the {len(prepared['evaluation_rows'])} evaluation questions (top-k) and their {evaluation} `squad-beir` queries "
            f"(nDCG@10) over {len(beir['passage_ids'])} passages. The gate: every shipped question, {len(prepared['qa'])} (top-k; "
            f"{prepared['counts']['train']} training, {prepared['counts']['dev']} evaluation), and {len(beir['queries'])} `squad-beir` "
            f"queries (nDCG@10).\n\n" + "\n".join(acc_rows) + "\n\n### The gate's verdicts\n\n"
            + (verdict_table(verdicts) + "\n" + describe(GateSettings(), max(len(v.checks) for v in verdicts))
               + " Top-k differences are in points; the interval is of the difference. The rule, and why: docs/encoding.md.\n"
               if verdicts else "No backend but torch ran: no verdict.\n"))


def gate(outcomes: dict, backends, library: str = "taser", models=GATED_MODELS) -> list:
    """The gate's verdict on each of `backends` but torch: every model x metric against `library`'s torch,
    Holm over one backend's checks. outcomes: (model, library, backend) -> {metric: per-question outcomes}."""
    from taser.evaluation.encoding_gate import judge

    verdicts = []
    for backend in backends:
        if backend == "torch":
            continue
        checks = {(model, metric): (outcomes[(model, library, "torch")][metric], outcomes[(model, library, backend)][metric])
                  for model in models for metric in GATED_METRICS
                  if metric in outcomes.get((model, library, "torch"), {}) and metric in outcomes.get((model, library, backend), {})}
        if checks:
            verdicts.append(judge(backend, checks))
    return verdicts


def record_cpu_kind(speed: list[dict], verdicts: list, path: Path = ROOT / "taser" / "models" / "backend_speeds.json") -> dict:
    """This CPU kind's entry of the record `backend=auto` reads (`taser.models.backend_choice`): each
    taser backend's median passages/s and questions/s of this run and its gate verdict (torch: passes),
    replacing the kind's earlier entry. A backend this run did not time keeps its earlier entry."""
    import datetime

    from taser.models.backend_choice import this_cpu
    from taser.runtime import describe_hardware

    kind = this_cpu()
    record = json.loads(path.read_text())
    earlier = next((e for e in record["kinds"] if kind.matches(e)), None)
    backends = dict(earlier["backends"]) if earlier else {}
    summary = {v.backend: v.summary() for v in verdicts}
    by_setting: dict[str, list[dict]] = {}
    for r in speed:
        if r["library"] == "taser":
            by_setting.setdefault(r["setting"], []).append(r)
    from taser.models.backends import RECIPES, Backend

    for setting, runs in by_setting.items():
        backends[setting] = {"passages_per_s": round(statistics.median(r["passages_per_s"] for r in runs), 1),
                             "questions_per_s": round(statistics.median(r["questions_per_s"] for r in runs)),
                             "gate": "passes" if setting == "torch" else summary.get(setting, "not judged"),
                             **({} if setting == "torch" else {"recipe": RECIPES[Backend(setting)][1]})}
    entry = {"cpu": kind.cpu, "capability": kind.capability, "native_bf16": kind.native_bf16, "cores": os.cpu_count(),
             "machine": describe_hardware("cpu"), "date": datetime.date.today().isoformat(), "source": "benchmarks/peers/encode_results.md",
             "gate_questions": max((c.questions for v in verdicts for c in v.checks), default=0), "backends": backends}
    record["kinds"] = [e for e in record["kinds"] if not kind.matches(e)] + [entry]
    path.write_text(json.dumps(record, indent=1) + "\n")
    return entry


def file_head() -> str:
    return ("# CPU encoding: taser's backends vs sentence-transformers' backends\n\n" + __doc__.split("\n\n", 2)[2]
            + "\nEach section says the run it comes from (its command, machine and date): `--accuracy-only` rewrites the accuracy "
            "section and keeps the speed section of an earlier run; the last section is written by hand.\n")


def write_sections(out: Path, head: str, written: dict[str, str]) -> str:
    """`head`, then each of SECTIONS: this run's text where it wrote one, else the earlier file's
    (each section names the run it comes from)."""
    earlier: dict[str, str] = {}
    if out.is_file():
        parts = ("\n" + out.read_text()).split("\n## ")
        for part in parts[1:]:
            heading = "## " + part.split("\n", 1)[0]
            earlier[heading] = "## " + part.rstrip("\n") + "\n"
    body = [written.get(h) or earlier.get(h) for h in SECTIONS]
    text = head + "\n" + "\n".join(b for b in body if b)
    out.write_text(text)
    return text


def runnable_backends(backends: list[str], native_bf16: bool) -> tuple[list[str], list[str]]:
    """(the taser backends this CPU can run, those left out): a bf16 backend needs native bf16."""
    from taser.models.backends import ENGINE_PRECISION

    left_out = [] if native_bf16 else [b for b in backends if ENGINE_PRECISION.get(b) == "bf16"]
    return [b for b in backends if b not in left_out], left_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench-encode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=256, help="sentence-transformers' max_seq_length (taser's checkpoint says 256 for MiniLM)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N passages, and the first N questions of each split (a quick look)")
    ap.add_argument("--taser-backends", nargs="+", default=list(TASER_BACKENDS), choices=TASER_BACKENDS)
    ap.add_argument("--peer-settings", nargs="*", default=list(PEER_SETTINGS), choices=PEER_SETTINGS)
    ap.add_argument("--peer-python", type=Path, default=ROOT / ".venv-peers-fast" / "bin" / "python",
                    help="the environment of sentence-transformers with its onnx and openvino extras (make peers-fast-env)")
    ap.add_argument("--dpr", help="a trained dpr checkpoint for the accuracy gate (default: train one)")
    ap.add_argument("--taser", help="a trained taser checkpoint for the accuracy gate (default: train one)")
    ap.add_argument("--train-steps", type=int, default=50, help="steps of the dpr and taser trained for the gate when not given")
    ap.add_argument("--out", type=Path, default=HERE / "encode_results.md")
    ap.add_argument("--accuracy-only", action="store_true",
                    help="no speed rounds: encode the trained dpr and taser in taser's backends, judge them with the gate, and keep "
                         "the file's speed section from its own run")
    ap.add_argument("--taser-speed-only", action="store_true",
                    help="speed rounds of taser's backends alone (the zero-shot MiniLM; no peers, no trained models, no gate), written to "
                         "the file's section on taser's backends side by side")
    ap.add_argument("--reuse-vectors", action="store_true",
                    help="reuse a setting's vectors from an earlier run of the same model, setting and texts (their speed is not re-measured)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--texts", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.out = Path(args.out)
        print(json.dumps(taser_child(args)))
        return
    if args.accuracy_only and args.taser_speed_only:
        raise SystemExit("--accuracy-only and --taser-speed-only exclude each other")
    if args.accuracy_only:
        args.peer_settings, args.rounds = [], 0
    if args.taser_speed_only:
        args.peer_settings = []
    if args.reuse_vectors and args.rounds:
        raise SystemExit("--reuse-vectors is for --accuracy-only: the speed rounds measure every setting afresh")
    if "torch" not in args.taser_backends:
        raise SystemExit("the gate judges each backend against taser's torch: --taser-backends must include torch")
    if args.peer_settings and not args.peer_python.is_file():
        raise SystemExit(f"sentence-transformers' environment is missing: {args.peer_python} (make peers-fast-env, or --peer-settings with nothing)")
    from taser.runtime import cpu_has_native_bf16

    args.taser_backends, left_out = runnable_backends(args.taser_backends, cpu_has_native_bf16())
    if left_out:
        print(f"{', '.join(left_out)} left out: this CPU has no native bf16 (bf16 backends refuse to run)", flush=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args.work.mkdir(parents=True, exist_ok=True)
    prepared = prepare(args)
    texts, models = prepared["texts"], prepared["models"]
    from taser.models.pretrained import SHIPPED_MODEL, resolve_pretrained

    st_model = str(resolve_pretrained(SHIPPED_MODEL))
    settings = [("taser", b) for b in args.taser_backends] + [("sentence-transformers", s) for s in args.peer_settings]
    speed, vectors = [], {}
    for rnd in range(1, args.rounds + 1):
        for library, setting in settings:
            out = args.work / "vectors" / "zero-shot" / library / setting
            model = models["zero-shot"] if library == "taser" else st_model
            result = {"round": rnd, **run_child(library, setting, model, out, args, texts)}
            speed.append(result)
            vectors[("zero-shot", library, setting)] = out
            print(json.dumps(result), flush=True)
    for name in () if args.taser_speed_only else TRAINED:
        for backend in args.taser_backends:
            out = args.work / "vectors" / name / "taser" / backend
            print(json.dumps({"model": name, **run_child("taser", backend, models[name], out, args, texts)}), flush=True)
            vectors[(name, "taser", backend)] = out
    answers = AnswerCache(prepared["qa"], prepared["passages"])
    acc, outcomes = {}, {}
    for key, out in vectors.items():
        acc[key], outcomes[key] = accuracy(out, answers, prepared)
        acc[key]["cosine"] = median_cosine(vectors[(key[0], key[1], "torch")], out) if (key[0], key[1], "torch") in vectors else float("nan")
    verdicts = gate(outcomes, args.taser_backends)
    zero_shot = {("taser", v.backend): v for v in gate(outcomes, args.taser_backends, "taser", ("zero-shot",))}
    zero_shot.update({("sentence-transformers", v.backend): v for v in gate(outcomes, args.peer_settings, "sentence-transformers", ("zero-shot",))})
    for v in verdicts:
        print(v.summary(), flush=True)
    gate_column = {("taser", v.backend): v.outcome for v in verdicts}
    gate_column.update({key: f"{v.outcome} (zero-shot)" for key, v in zero_shot.items() if key[0] != "taser"})
    gate_column.update({(library, "torch"): "reference" for library in ("taser", "sentence-transformers")})
    versions = json.dumps(next((r.get("versions") for r in speed if r.get("versions")), {}))
    record = {"speed": speed, "accuracy": {" / ".join(k): v for k, v in acc.items()}, "gate": [v.as_dict() for v in verdicts],
              "gate_zero_shot": {" / ".join(k): v.as_dict() for k, v in zero_shot.items()}}
    (args.work / ("results-taser-speed.json" if args.taser_speed_only else "results.json")).write_text(json.dumps(record, indent=2))
    if args.taser_speed_only:
        written = {TASER_SPEED: taser_speed_section(args, prepared, speed)}
    else:
        written = {ACCURACY: accuracy_section(args, prepared, acc, verdicts)}
    if speed and not args.taser_speed_only:
        written[SPEED] = speed_section(args, prepared, speed, versions, gate_column)
    if speed and verdicts and args.limit is None:
        entry = record_cpu_kind(speed, verdicts)
        print(f"backend=auto's record for {entry['machine']}: taser/models/backend_speeds.json", flush=True)
    print(write_sections(args.out, file_head(), written))


if __name__ == "__main__":
    main()
