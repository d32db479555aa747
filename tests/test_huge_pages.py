"""taser.huge_pages.active: whether the environment put this process's large tensors on huge pages."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from taser import huge_pages

KERNEL_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def lends_huge_pages() -> bool:
    try:
        return any(f"[{mode}]" in KERNEL_SETTING.read_text() for mode in ("always", "madvise"))
    except OSError:
        return False


def _active_in_child(env_value: str) -> str:
    env = {**os.environ, huge_pages.ENV: env_value}
    code = "from taser import huge_pages; print(huge_pages.active())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(not lends_huge_pages() or "[always]" in KERNEL_SETTING.read_text(),
                    reason="needs a kernel that lends transparent huge pages on request (madvise)")
def test_active_tells_whether_the_environment_asked_for_huge_pages():
    assert _active_in_child("1") == "True"
    assert _active_in_child("0") == "False"


def test_the_scripts_leave_the_setting_to_the_environment(monkeypatch):
    monkeypatch.delenv(huge_pages.ENV, raising=False)
    import taser.cli  # noqa: F401  (measured not to pay: taser does not set it)

    assert huge_pages.ENV not in os.environ
