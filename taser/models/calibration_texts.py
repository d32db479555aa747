"""Calibration texts of `backend=onnx_int8_static` (`taser.models.onnx_backend`): 128 questions and
128 passages (title, text) of the shipped SQuAD file's 30 training articles (the SQuAD protocol's
training split: no evaluation question or its article), evenly spaced. They are package data,
`calibration_texts.json` beside this module, written by benchmarks/peers/calibration_texts.py;
changing them changes the graphs (their digest is in the cache)."""

from __future__ import annotations

import functools
import json
from importlib import resources

FILE = "calibration_texts.json"


@functools.cache
def _texts() -> dict:
    return json.loads(resources.files(__package__).joinpath(FILE).read_text(encoding="utf-8"))


def questions() -> tuple[str, ...]:
    return tuple(_texts()["questions"])


def passages() -> tuple[tuple[str, str], ...]:
    return tuple((title, text) for title, text in _texts()["passages"])
