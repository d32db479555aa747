"""Answer scoring of a reader's prediction: exact match and F1 with SQuAD's normalisation (the one
DPR's reader uses: lower case, ASCII punctuation removed, the articles a/an/the removed, white
space collapsed), the best over a question's accepted answers.

Both sides are first put in Unicode NFD, as DPR's answer matching does, so a composed and a
decomposed accent compare equal. CuratedTREC's answers are regular expressions: a prediction
matches when a pattern matches at its start (DrQA's `regex_match_score`, the rule its
CuratedTREC EM is reported with), case-insensitively, NFD on both sides; F1 then equals EM. A
pattern that does not compile is a miss (DPR's rule), with a warning from
`taser.evaluation.answers`.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence

from taser.data.config import Match
from taser.evaluation.answers import compile_pattern

_ARTICLES = re.compile(r"\b(a|an|the)\b", flags=re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's `normalize_answer` (after NFD): lower, no punctuation, no articles, single spaces."""
    text = unicodedata.normalize("NFD", text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: Sequence[str]) -> bool:
    norm = normalize_answer(prediction)
    return any(norm == normalize_answer(a) for a in answers)


def _f1(prediction: str, answer: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(answer).split()
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, answers: Sequence[str]) -> float:
    return max((_f1(prediction, a) for a in answers), default=0.0)


def regex_match(prediction: str, patterns: Sequence[str]) -> bool:
    text = unicodedata.normalize("NFD", prediction)
    for pattern in patterns:
        compiled = compile_pattern(pattern)
        if compiled is not None and compiled.match(text) is not None:
            return True
    return False


def score_prediction(prediction: str, answers: Sequence[str], match: str = "string") -> tuple[float, float]:
    """(EM, F1) of `prediction`, each 0..1, against `answers` under `match` (string or regex)."""
    match = Match.parse(match, "answer match mode")
    if match == Match.regex:
        hit = float(regex_match(prediction, answers))
        return hit, hit
    return float(exact_match(prediction, answers)), f1_score(prediction, answers)
