"""Top-k accuracy and its one-line summary, on hand-computed cases."""

import pytest

from taser.evaluation.topk import format_topk, top_k_accuracy


def test_top_k_accuracy_by_hand():
    hits = [
        [False, True, False],  # first hit at rank 2
        [False, False, False, False, False, True],  # rank 6
        [True],  # rank 1, only one passage retrieved
        [False, False, False],  # never
    ]
    assert top_k_accuracy(hits, ks=(6, 1, 2, 5)) == {1: 25.0, 2: 50.0, 5: 50.0, 6: 75.0}


def test_fewer_passages_than_k_counts_with_what_it_has():
    assert top_k_accuracy([[False, True], []], ks=(1, 100)) == {1: 0.0, 100: 50.0}


def test_default_ks():
    assert top_k_accuracy([[True], [False] * 100 + [True]]) == {1: 50.0, 5: 50.0, 20: 50.0, 100: 50.0}


def test_bad_input():
    with pytest.raises(ValueError, match="no questions"):
        top_k_accuracy([])
    with pytest.raises(ValueError, match="positive"):
        top_k_accuracy([[True]], ks=(0, 1))


def test_format_topk():
    assert format_topk({5: 75.6, 1: 46.14, 100: 97.25, 20: 90.0}) == "top-1 46.1 / top-5 75.6 / top-20 90.0 / top-100 97.2"
