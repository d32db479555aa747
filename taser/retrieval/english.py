"""An English analyzer for the in-process BM25 backend, close to Lucene's English one.

Lower-cased word tokens (inner apostrophes and dots kept, numbers with separators kept whole),
the possessive 's dropped, Lucene's English stop words removed, then Porter's (1980) stemmer
as in Lucene's PorterStemFilter. `ANALYZER` names this behaviour; it is recorded in each bm25s
index so an index is never searched with a different analyzer than it was built with.
"""

from __future__ import annotations

import re

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET, which Anserini's default analyzer uses.
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)
# Words, keeping inner apostrophes and dots (don't, u.s) and numbers with separators (1,000.5).
_TOKEN = re.compile(r"\d+(?:[.,]\d+)+|\w+(?:['’.]\w+)*")
ANALYZER = "english-porter-v1"


def english_terms(text: str) -> list[str]:
    """Lower-cased tokens, possessive 's dropped, stop words removed, Porter-stemmed."""
    terms = []
    for token in _TOKEN.findall(text.lower()):
        if token.endswith(("'s", "’s")):
            token = token[:-2]
        if token and token not in STOP_WORDS:
            terms.append(porter_stem(token))
    return terms


def _is_consonant(w: str, i: int) -> bool:
    if w[i] in "aeiou":
        return False
    return w[i] != "y" or i == 0 or not _is_consonant(w, i - 1)


def _measure(stem: str) -> int:
    """Porter's m: the number of vowel-consonant sequences in `stem`."""
    m, after_vowel = 0, False
    for i in range(len(stem)):
        consonant = _is_consonant(stem, i)
        m += after_vowel and consonant
        after_vowel = not consonant
    return m


def _has_vowel(stem: str) -> bool:
    return any(not _is_consonant(stem, i) for i in range(len(stem)))


def _double_consonant(w: str) -> bool:
    return len(w) >= 2 and w[-1] == w[-2] and _is_consonant(w, len(w) - 1)


def _cvc(w: str) -> bool:
    """Ends consonant-vowel-consonant, the last not w, x or y (Porter's *o)."""
    n = len(w)
    return (n >= 3 and _is_consonant(w, n - 3) and not _is_consonant(w, n - 2)
            and _is_consonant(w, n - 1) and w[-1] not in "wxy")


# Suffix rules: the first suffix a word ends with decides (a longer one is listed before any
# suffix it ends with); it is replaced only if the rest has measure > min_m.
_STEP2 = [("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"), ("izer", "ize"),
          ("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous"),
          ("ization", "ize"), ("ation", "ate"), ("ator", "ate"), ("alism", "al"), ("iveness", "ive"),
          ("fulness", "ful"), ("ousness", "ous"), ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"),
          ("logi", "log")]
_STEP3 = [("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"),
          ("ful", ""), ("ness", "")]
_STEP4 = [(s, "") for s in ("al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment",
                            "ent", "sion", "tion", "ou", "ism", "ate", "iti", "ous", "ive", "ize")]


def _replace_suffix(w: str, rules: list[tuple[str, str]], min_m: int) -> str:
    for suffix, replacement in rules:
        if w.endswith(suffix):
            # "sion"/"tion" stand for Porter's "ion" after s or t: only "ion" is removed.
            cut = len(suffix) - 1 if suffix in ("sion", "tion") else len(suffix)
            stem = w[:-cut]
            return stem + replacement if _measure(stem) > min_m else w
    return w


def porter_stem(w: str) -> str:
    """Porter's (1980) stemmer, as in Lucene's PorterStemFilter, for a lower-case word."""
    if len(w) <= 2:
        return w
    # Step 1a: plurals.
    if w.endswith(("sses", "ies")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    # Step 1b: -eed, -ed, -ing.
    if w.endswith("eed"):
        if _measure(w[:-3]) > 0:
            w = w[:-1]
    else:
        for suffix in ("ed", "ing"):
            if w.endswith(suffix) and _has_vowel(w[: -len(suffix)]):
                w = w[: -len(suffix)]
                if w.endswith(("at", "bl", "iz")):
                    w += "e"
                elif _double_consonant(w) and w[-1] not in "lsz":
                    w = w[:-1]
                elif _measure(w) == 1 and _cvc(w):
                    w += "e"
                break
    # Step 1c: y -> i after a vowel.
    if w.endswith("y") and _has_vowel(w[:-1]):
        w = w[:-1] + "i"
    w = _replace_suffix(w, _STEP2, 0)
    w = _replace_suffix(w, _STEP3, 0)
    w = _replace_suffix(w, _STEP4, 1)
    # Step 5: final -e and -ll.
    if w.endswith("e"):
        m = _measure(w[:-1])
        if m > 1 or (m == 1 and not _cvc(w[:-1])):
            w = w[:-1]
    if w.endswith("ll") and _measure(w) > 1:
        w = w[:-1]
    return w
