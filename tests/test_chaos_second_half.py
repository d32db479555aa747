"""The chaos test's second ten kills (tests/test_chaos.py, half 1) in a file of its own: `make test-cluster` gives
each test file a worker (--dist loadfile), so the two halves run side by side instead of one after the other."""

import pytest
from test_chaos import test_a_table_killed_at_random_moments_finishes_with_the_uninterrupted_results as chaos_half
from test_experiment import squad4  # noqa: F401 - a fixture

pytestmark = pytest.mark.cluster


def test_a_table_killed_at_random_moments_second_half(squad4, tiny_pretrained, tmp_path):  # noqa: F811
    chaos_half(squad4, tiny_pretrained, tmp_path, half=1)
