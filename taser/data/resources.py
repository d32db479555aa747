"""The data and checkpoints a table needs, by name: where each is published and where it lands.

Names and layout are DPR's own (`dpr/data/download_data.py`): `data.retriever.nq-train` lands at
`<data_dir>/data/retriever/nq-train.json`, so DPR's configs and this library's `configs/data/*.yaml`
find the files where DPR's downloader would have put them. DPR publishes no checksums: a resource
without a published one has its SHA-256 recorded at the first download (`<data_dir>/checksums.json`)
and checked at every later one (`taser.pipeline.download`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DPR = "https://dl.fbaipublicfiles.com/dpr"
NQ_LICENSE = "NQ: CC BY-SA 3.0 (DPR's nq_license files)"


@dataclass(frozen=True)
class Resource:
    name: str
    url: str
    ext: str  # the file's extension once unpacked
    gzip: bool = False  # published gzip-compressed (unpacked after the download)
    sha256: str | None = None  # the publisher's checksum of the downloaded file; None: recorded at the first download
    desc: str = ""
    licence: str = ""

    def path(self, data_dir: str | Path) -> Path:
        """Where the unpacked file lands: DPR's layout, the name's parts as directories."""
        *dirs, last = self.name.split(".")
        return Path(data_dir, *dirs, last + self.ext)

    @property
    def download_name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def _dpr(name: str, path: str, ext: str, gzip: bool, desc: str, licence: str = "") -> Resource:
    return Resource(name, f"{DPR}/{path}", ext, gzip, None, desc, licence)


_LIST = [
    _dpr("data.wikipedia_split.psgs_w100", "wikipedia_split/psgs_w100.tsv.gz", ".tsv", True,
         "English Wikipedia (Dec. 2018) split into 21M disjoint 100-word passages (id, text, title); 13 GB unpacked"),
    _dpr("data.retriever.nq-train", "data/retriever/biencoder-nq-train.json.gz", ".json", True, "NQ training questions with BM25 hard negatives",
         NQ_LICENSE),
    _dpr("data.retriever.nq-dev", "data/retriever/biencoder-nq-dev.json.gz", ".json", True, "NQ dev questions (training-time validation)", NQ_LICENSE),
    _dpr("data.retriever.trivia-train", "data/retriever/biencoder-trivia-train.json.gz", ".json", True, "TriviaQA training questions"),
    _dpr("data.retriever.trivia-dev", "data/retriever/biencoder-trivia-dev.json.gz", ".json", True, "TriviaQA dev questions"),
    _dpr("data.retriever.squad1-train", "data/retriever/biencoder-squad1-train.json.gz", ".json", True, "SQuAD 1.1 training questions"),
    _dpr("data.retriever.webq-train", "data/retriever/biencoder-webquestions-train.json.gz", ".json", True, "WebQuestions training questions"),
    _dpr("data.retriever.curatedtrec-train", "data/retriever/biencoder-curatedtrec-train.json.gz", ".json", True, "CuratedTREC training questions"),
    _dpr("data.retriever.qas.nq-dev", "data/retriever/nq-dev.qa.csv", ".csv", False, "NQ dev questions and answers (QA TSV)", NQ_LICENSE),
    _dpr("data.retriever.qas.nq-train", "data/retriever/nq-train.qa.csv", ".csv", False,
         "NQ training questions and answers (QA TSV): distant supervision's input", NQ_LICENSE),
    _dpr("data.retriever.qas.nq-test", "data/retriever/nq-test.qa.csv", ".csv", False, "NQ test questions and answers (QA TSV)", NQ_LICENSE),
    _dpr("data.retriever.qas.trivia-test", "data/retriever/trivia-test.qa.csv.gz", ".csv", True, "TriviaQA test questions and answers"),
    _dpr("data.retriever.qas.trivia-dev", "data/retriever/trivia-dev.qa.csv.gz", ".csv", True, "TriviaQA dev questions and answers"),
    _dpr("data.retriever.qas.squad1-test", "data/retriever/squad1-test.qa.csv", ".csv", False, "SQuAD 1.1 test questions and answers"),
    _dpr("data.retriever.qas.webq-test", "data/retriever/webquestions-test.qa.csv", ".csv", False, "WebQuestions test questions and answers"),
    _dpr("data.retriever.qas.curatedtrec-test", "data/retriever/curatedtrec-test.qa.csv", ".csv", False, "CuratedTREC test questions (regexes)"),
    _dpr("data.gold_passages_info.nq_train", "data/nq_gold_info/nq-train_gold_info.json.gz", ".json", True, "NQ training questions' gold passages",
         NQ_LICENSE),
    _dpr("checkpoint.retriever.single.nq.bert-base-encoder", "checkpoint/retriever/single/nq/hf_bert_base.cp", ".cp", False,
         "DPR's NQ-trained bi-encoder (import: taser-convert-checkpoint conversion=import_dpr_cp allow_pickle=true)"),
    _dpr("checkpoint.retriever.multiset.bert-base-encoder", "checkpoint/retriver/multiset/hf_bert_base.cp", ".cp", False,
         "DPR's multi-set bi-encoder (import: conversion=import_dpr_cp allow_pickle=true)"),
    Resource("checkpoint.taser.bert-base-uncased", "https://huggingface.co/kelvinih/taser-bert-base-uncased/resolve/main/pytorch_model.bin", ".bin",
             desc="TASER's released BERT-base checkpoint (import: taser-convert-checkpoint conversion=import_taser allow_pickle=true)"),
]
RESOURCES: dict[str, Resource] = {r.name: r for r in _LIST}


def resource(name: str) -> Resource:
    if name not in RESOURCES:
        raise ValueError(f"unknown resource {name!r}; known: {', '.join(RESOURCES)}")
    return RESOURCES[name]
