"""DPR's answer matching: does a passage contain one of a question's answers?

`has_answer` reproduces DPR's `has_answer` exactly, so that top-k accuracies are comparable
with published numbers. Callers pass the passage *text* only: DPR never matches the title.

- "string" mode: Unicode NFD, DPR's SimpleTokenizer, lower case; an answer matches when its
  tokens are a contiguous run of the passage's tokens.
- "regex" mode (CuratedTREC): each answer is a regular expression, NFD-normalised like the
  text, searched case-insensitively. A pattern that does not compile is a miss, as in DPR
  (a few CuratedTREC patterns break under NFD); we also warn, once per pattern.
"""

from __future__ import annotations

import functools
import re
import unicodedata
import warnings
from collections.abc import Sequence

import regex

from taser.data.config import Match

# Token separator for the joined form below: it is a control character (\p{C}), so no token
# contains it, and it is neither cased nor case-ignorable, so lower-casing the joined string
# equals lower-casing each token on its own (this matters for Greek final sigma).
_SEP = "\x00"


class SimpleTokenizer:
    """DPR's SimpleTokenizer: runs of letters, digits and marks, or single other visible characters."""

    _pattern = regex.compile(
        r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]",
        flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE,
    )

    # The same classes restricted to ASCII (letters and digits; anything but controls and
    # space), for the stdlib `re`, which is about 3x faster here on the hot path.
    _ascii_pattern = re.compile(r"[A-Za-z0-9]+|[^\x00-\x20\x7f]")

    def tokenize(self, text: str) -> list[str]:
        """The tokens of `text`, case preserved."""
        if text.isascii():
            return self._ascii_pattern.findall(text)
        return self._pattern.findall(text)

    def words(self, text: str) -> list[str]:
        """The tokens of `text`, lower-cased (what matching compares)."""
        return [t.lower() for t in self.tokenize(text)]


_TOKENIZER = SimpleTokenizer()


def _nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def _joined_words(text: str) -> str:
    """NFD, tokenise and lower-case `text`; tokens joined and framed by _SEP.

    A contiguous run of tokens is then a plain substring test on these strings.
    """
    return _SEP + _SEP.join(_TOKENIZER.tokenize(_nfd(text))).lower() + _SEP


@functools.lru_cache(maxsize=1 << 16)
def _answer_needle(answer: str) -> str | None:
    """The joined form of an answer's tokens; None when the answer has no tokens."""
    tokens = _TOKENIZER.tokenize(_nfd(answer))
    if not tokens:
        return None
    return _SEP + _SEP.join(tokens).lower() + _SEP


@functools.lru_cache(maxsize=1 << 14)
def compile_pattern(pattern: str) -> re.Pattern | None:
    """Compile an NFD-normalised answer pattern; None (and a warning) if it does not compile."""
    try:
        return re.compile(_nfd(pattern), flags=re.IGNORECASE | re.UNICODE | re.MULTILINE)
    except Exception as e:  # re.error, but also OverflowError/RecursionError on odd patterns
        warnings.warn(f"answer pattern {pattern!r} does not compile after NFD ({e}); counted as a miss", stacklevel=4)
        return None


def _has_string_answer(answers: Sequence[str], text: str) -> bool:
    haystack = None
    for answer in answers:
        needle = _answer_needle(answer)
        if needle is None:
            # DPR compares an empty token list with every empty slice: a match anywhere.
            return True
        if haystack is None:
            haystack = _joined_words(text)
        if needle in haystack:
            return True
    return False


def _has_regex_answer(answers: Sequence[str], text: str) -> bool:
    text = _nfd(text)
    for answer in answers:
        pattern = compile_pattern(answer)
        if pattern is not None and pattern.search(text) is not None:
            return True
    return False


def has_answer(answers: Sequence[str], text: str, match: str = "string") -> bool:
    """True when passage `text` contains one of `answers` under DPR's rule for `match`.

    `match` is "string" (token match) or "regex" (CuratedTREC patterns). Pass the passage
    text only, not its title.
    """
    match = Match.parse(match, "answer match mode")
    if match == "string":
        return _has_string_answer(answers, text)
    if match == "regex":
        return _has_regex_answer(answers, text)
    raise AssertionError(match)
