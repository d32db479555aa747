"""Shared fixtures: a tiny random BERT (2 layers, hidden 64) with MiniLM's tokenizer, and real
SQuAD-derived data (the shipped file, a few articles of it for speed)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]

# `make test` runs the suite on every core (pytest-xdist, -n auto): each worker, and the processes
# its tests start, get their share of the cores rather than each a thread per core.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // _WORKERS))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _children_import_this_package() -> None:
    """Processes a test starts with this environment import the `taser` this run imports: under
    `make mutants`, the mutated copy (with the active mutant in `MUTANT_UNDER_TEST`), not the
    checkout's editable install, so tests that run scripts in a child can kill mutants too."""
    import taser

    here = str(Path(taser.__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


_children_import_this_package()
# Scripts run in-process (runpy) import their `_environment` guard as `python scripts/x.py` does,
# from the scripts' own directory.
sys.path.insert(0, str(ROOT / "scripts"))
FIXTURES = ROOT / "tests" / "fixtures"
SQUAD = ROOT / "data" / "squad" / "squad-v1.1-dev-40-articles.json"


def tiny_bert_config(vocab_size: int, layers: int = 2):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=128, max_position_embeddings=512
    )


@pytest.fixture(scope="session")
def tokenizer():
    from taser.models.biencoder import load_tokenizer

    return load_tokenizer("shipped:all-MiniLM-L6-v2")


@pytest.fixture(scope="session")
def tiny_pretrained(tmp_path_factory, tokenizer) -> str:
    """A directory holding a tiny random BERT and MiniLM's tokenizer, like any local model."""
    import torch
    from transformers import BertModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-bert")
    BertModel(tiny_bert_config(tokenizer.vocab_size)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def mini_squad(tmp_path_factory) -> Path:
    """The first 4 articles of the shipped SQuAD file, converted: 3 train articles, 1 dev."""
    from taser.data.squad import convert_squad

    data = json.loads(SQUAD.read_text())
    tmp = tmp_path_factory.mktemp("mini-squad")
    src = tmp / "squad-4.json"
    src.write_text(json.dumps({"version": "1.1", "data": data["data"][:4]}))
    convert_squad(src, tmp / "prepared", train_articles=3, random_negatives=4, seed=0)
    return tmp / "prepared"


def tiny_model_cfg(pretrained: str, model_type: str = "dpr", **extra) -> dict:
    cfg = {
        "model_type": model_type,
        "pretrained": pretrained,
        "pooling": "cls",
        "normalize": False,
        "similarity": "dot",
        "max_length": 64,
        "max_question_length": 32,
    }
    cfg.update(extra)
    return cfg


class LockClock:
    """A waiter's own clock for stage locks (`_FileLock.clock`): `advance(s)` moves it on; with `jump`,
    every look is that many seconds after the last (a lock seen twice unchanged is past every limit)."""

    def __init__(self, jump: float = 0.0):
        self.now, self.jump = 0.0, jump

    def __call__(self) -> float:
        self.now += self.jump
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def lock_clock(monkeypatch) -> LockClock:
    from taser.pipeline.stages import _FileLock

    clock = LockClock()
    monkeypatch.setattr(_FileLock, "clock", staticmethod(clock))
    return clock


@pytest.fixture
def jumping_lock_clock(monkeypatch) -> LockClock:
    from taser.pipeline.stages import _FileLock

    clock = LockClock(jump=1000.0)
    monkeypatch.setattr(_FileLock, "clock", staticmethod(clock))
    return clock


def pytest_collection_modifyitems(config, items):
    # the slow tests first: with the suite spread over workers, a worker then ends on short tests
    # instead of starting a minute-long one when the others are done
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def load_script(path, name: str):
    """A script that is not a package module (a benchmark), imported from its file under `name`."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module
