"""Where an inspection page's texts come from (`taser.evaluation.inspect_page`): the runs' own
records and the data they name: a `retrieval.json` beside `results.json` (questions, answers,
retrieved passages); else the QA file and passages `results.json` names (`qa_file`, `passages`,
`squad_json`), else the data of the table preset that evaluates the run's dataset
(`configs/table/*.yaml`). A recorded path is tried as given, under the repository, the current
directory and the run's directories. Only the questions and passages shown are kept: a QA file or
passages TSV is streamed once, after the ids needed are known (DPR's 21M passages never sit in
memory). What cannot be found is collected as problems, with how to get it."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from taser.data.passages import Passage, read_passages
from taser.data.retrieval_json import iter_retrieval_results
from taser.evaluation.runs import RunResult
from taser.shipped import CONFIG_DIR, shipped_file

PASSAGES_SHOWN = 5
REPO_ROOT = Path(__file__).resolve().parents[2]
TABLE_PRESETS = Path(CONFIG_DIR) / "table"
PASSAGE_KEYS = ("passages", "passages_tsv", "passages_file")  # the keys of results.json that may name the passages TSV

log = logging.getLogger(__name__)


@dataclass
class QuestionText:
    question: str
    answers: list[str]
    gold: str | None = None  # the id of the passage the question was written from (SQuAD), when known


@dataclass
class Texts:
    """The texts of the questions shown (by 0-based position in the run's QA file) and of the passages
    shown (by id), where they came from, and what is missing with how to get it."""

    questions: dict[int, QuestionText] = field(default_factory=dict)
    passages: dict[str, Passage] = field(default_factory=dict)
    source: str = ""  # a sentence for the page: which files, found how
    problems: list[str] = field(default_factory=list)  # each: what is missing, where it was looked for, how to get it
    named: DataNamed | None = None  # the data the runs name, when any
    run_dir: Path | None = None  # the directory of the run that named it (where its relative paths may start)


def _results(run: RunResult) -> dict:
    try:
        return json.loads(Path(run.path).read_text(encoding="utf-8")) if run.path else {}
    except (OSError, ValueError):
        return {}


def _candidates(recorded: str, run_dir: Path | None) -> list[Path]:
    """Where a path recorded by a run may be now: as given; relative to the repository, the current
    directory, the run's directory and its parents; an absolute path of another checkout or machine
    re-rooted under the repository and the current directory (its last 2, 3, ... parts)."""
    given = Path(os.path.expanduser(recorded))
    roots = [REPO_ROOT, Path.cwd()]
    if run_dir is not None:
        roots += [run_dir, *run_dir.parents]
    out = [given] if given.is_absolute() else [root / given for root in roots] + [shipped_file(given)]
    if given.is_absolute():
        parts = given.parts[1:]
        out += [root / Path(*parts[i:]) for i in range(len(parts) - 2, -1, -1) for root in roots[:2]][::-1]
    return list(dict.fromkeys(Path(os.path.abspath(p)) for p in out))


def locate(recorded: str, run_dir: Path | None = None) -> tuple[Path | None, list[Path]]:
    """The file a run's recorded path names (None when none of the candidates exists), and the paths tried."""
    tried = _candidates(recorded, run_dir)
    return next((p for p in tried if p.is_file()), None), tried


def _tried(paths: Sequence[Path]) -> str:
    shown = [str(p) for p in paths[:4]]
    return ", ".join(shown) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")


def _hint(path: str, preset: str | None = None, data_dir: str | None = None) -> str:
    """How to get a missing data file back."""
    name = Path(path).name
    if name.endswith(".json") and "squad" in name.lower() and Path(path).parent.name == "squad":
        return f"it ships with the repository: `git checkout -- data/squad/{name}` (docs/data.md)"
    if name in ("passages.tsv", "dev.qa.tsv", "train.qa.tsv", "dev.json", "train.json"):
        return f"recreate it from the shipped SQuAD JSON: `taser-prepare-squad out_dir={Path(path).parent}`"
    if preset is not None:
        return f"fetch it: `taser-download table={preset} data_dir={data_dir or 'data/downloads'}` (docs/data.md)"
    return "fetch it with `taser-download` (docs/data.md lists the resources)"


def _preset(dataset: str) -> tuple[str, dict] | None:
    """The first table preset (configs/table/*.yaml) whose data is the dataset named `dataset`: (its name, its `table.data`)."""
    import yaml

    for path in sorted(TABLE_PRESETS.glob("*.yaml")):
        try:
            data = ((yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("table") or {}).get("data") or {}
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if isinstance(data, dict) and str(data.get("dataset")) == dataset:
            return path.stem, data
    return None


@dataclass
class DataNamed:
    """The data one run was evaluated on, as far as its records (or its table preset) name it."""

    how: str  # "its results.json" or "the table preset configs/table/<name>.yaml (the run names no data)"
    squad_json: str | None = None
    train_articles: int = 30
    qa_file: str | None = None
    passages: str | None = None
    preset: str | None = None
    data_dir: str | None = None


def data_named(run: RunResult) -> DataNamed | None:
    """What `run` says it was evaluated on: `qa_file` / `passages` / `squad_json` (and `train_articles`)
    in its results.json (or under a `data` object there), else the data of the table preset that
    evaluates its dataset; None when neither names any."""
    results = _results(run)
    record = {**(results.get("data") if isinstance(results.get("data"), dict) else {}), **results}
    passages = next((record[k] for k in PASSAGE_KEYS if isinstance(record.get(k), str)), None)
    named = {k: record.get(k) for k in ("qa_file", "squad_json") if isinstance(record.get(k), str)}
    if named or passages:
        return DataNamed(f"{Path(run.path).name if run.path else 'results.json'} of the run", named.get("squad_json"),
                         int(record.get("train_articles") or 30), named.get("qa_file"), passages)
    found = _preset(run.dataset)
    if found is None:
        return None
    name, spec = found
    how = f"the table preset configs/table/{name}.yaml, which evaluates {run.dataset}; the run's results.json names no data"
    if spec.get("squad_json"):
        return DataNamed(how, str(spec["squad_json"]), int(spec.get("train_articles") or 30), preset=name)
    root = str(spec.get("data_dir") or ".")
    join = (lambda f: str(Path(root) / str(f)) if f else None)  # noqa: E731
    return DataNamed(how, qa_file=join(spec.get("qa_file")), passages=join(spec.get("passages")), preset=name, data_dir=root)


def passages_by_id(path: str | os.PathLike, ids: Iterable[str]) -> dict[str, Passage]:
    """The passages of a passages TSV with the ids wanted: one streaming pass, stopping once all are
    found; no other passage is kept."""
    wanted, found = set(map(str, ids)), {}
    if not wanted:
        return found
    for passage in read_passages(path):
        if passage.id in wanted:
            found[passage.id] = passage
            if len(found) == len(wanted):
                break
    return found


def _squad_texts(path: Path, train_articles: int, needed: set[int], questions: int) -> tuple[dict[int, QuestionText], dict[str, Passage]]:
    """The dev split of a SQuAD JSON as `taser.data.squad.convert_squad` writes it (the articles after the
    first `train_articles`): the questions needed with the passage each was written from."""
    from taser.data.squad import load_squad

    corpus, articles = load_squad(path)
    dev = [q for a in articles[train_articles:] for q in a.questions]
    if len(dev) != questions:
        raise ValueError(f"{path} split after {train_articles} articles holds {len(dev):,} questions, the runs {questions:,}: "
                         "not the data they were evaluated on")
    out, passages = {}, {}
    for i in sorted(n for n in needed if n < len(dev)):
        q = dev[i]
        gold = corpus[q.positive] if q.positive is not None else None
        out[i] = QuestionText(q.question, list(q.answers), gold.id if gold else None)
        if gold is not None:
            passages[gold.id] = gold
    return out, passages


def _qa_texts(path: Path, needed: set[int], questions: int) -> dict[int, QuestionText]:
    """The questions needed of a QA TSV, streamed; the file must hold as many questions as the runs."""
    from taser.data.qa import read_qa

    out, count = {}, 0
    for i, pair in enumerate(read_qa(path)):
        count += 1
        if i in needed:
            out[i] = QuestionText(pair.question, list(pair.answers))
    if count != questions:
        raise ValueError(f"{path} holds {count:,} questions, the runs {questions:,}: not the data they were evaluated on")
    return out


def runs_data(runs: Sequence[RunResult], needed: set[int], questions: int) -> Texts:
    """The texts of the questions at the positions `needed` (and of the passages they were written
    from, where the data says) from the data the first of `runs` that names any names; `questions`:
    how many the runs were evaluated on (a file holding another count is not theirs)."""
    texts = Texts()
    named, run = next(((d, r) for r in runs if (d := data_named(r)) is not None), (None, None))
    texts.named, texts.run_dir = named, (Path(run.path).parent if run is not None and run.path else None)
    if named is None:
        names = ", ".join(sorted({r.dataset for r in runs}))
        texts.problems.append(f"the runs name no data (their results.json holds no qa_file, passages or squad_json) and no table preset "
                              f"(configs/table/*.yaml) evaluates a dataset named {names}: evaluate again with taser-evaluate, "
                              "which keeps retrieval.json (questions, answers, passages) beside results.json")
        return texts
    run_dir = texts.run_dir
    source = named.squad_json or named.qa_file
    if source is None:
        texts.problems.append(f"{named.how} names passages but no QA file: the questions' texts are unknown")
        return texts
    path, tried = locate(source, run_dir)
    if path is None:
        texts.problems.append(f"{source} (named by {named.how}) is missing: tried {_tried(tried)}; {_hint(source, named.preset, named.data_dir)}")
        return texts
    try:
        if named.squad_json:
            texts.questions, texts.passages = _squad_texts(path, named.train_articles, needed, questions)
            texts.source = (f"Questions, answers and the passage each was written from: {_display(path)} (the articles after the first "
                            f"{named.train_articles}, as taser-prepare-squad splits it), named by {named.how}.")
        else:
            texts.questions = _qa_texts(path, needed, questions)
            texts.source = f"Questions and answers: {_display(path)}, named by {named.how}."
    except (ValueError, OSError) as e:
        texts.problems.append(f"{e} (named by {named.how})")
    return texts


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def retrieval_records(run: RunResult, needed: set[int]) -> dict[int, dict] | None:
    """The records at the positions `needed` of the retrieval.json beside the run's results.json (its
    first passages only), streamed; None without the file."""
    if not run.path:
        return None
    path = Path(run.path).parent / "retrieval.json"
    if not path.is_file():
        return None
    out: dict[int, dict] = {}
    if not needed:
        return out
    for i, record in enumerate(iter_retrieval_results(path)):
        if i in needed:
            out[i] = {**record, "ctxs": record["ctxs"][:PASSAGES_SHOWN]}
            if len(out) == len(needed):
                break
    return out


def fill_ctx_texts(records: Iterable[dict], runs: Sequence[RunResult], texts: Texts) -> None:
    """Retrieved passages recorded by id only get their title and text from the passages TSV the runs
    name (one streaming pass for all of them)."""
    bare = [ctx for record in records for ctx in record["ctxs"] if not ctx.get("text")]
    if not bare:
        return
    if texts.named is None:
        texts.named, run = next(((d, r) for r in runs if (d := data_named(r)) is not None), (None, None))
        texts.run_dir = Path(run.path).parent if run is not None and run.path else None
    named = texts.named
    if named is None or not named.passages:
        texts.problems.append(f"{len(bare)} retrieved passage(s) are recorded by id only and the runs name no passages file to read them from")
        return
    path, tried = locate(named.passages, texts.run_dir)
    if path is None:
        texts.problems.append(f"{named.passages} (named by {named.how}) is missing: tried {_tried(tried)}; "
                              f"{_hint(named.passages, named.preset, named.data_dir)}")
        return
    found = passages_by_id(path, {str(ctx["id"]) for ctx in bare})
    for ctx in bare:
        passage = found.get(str(ctx["id"]))
        if passage is not None:
            ctx["title"], ctx["text"] = passage.title, passage.text
    lost = len({str(ctx["id"]) for ctx in bare} - set(found))
    if lost:
        texts.problems.append(f"{lost} retrieved passage id(s) are not in {_display(path)}: not the passages the runs searched")
