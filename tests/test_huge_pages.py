"""Huge-page tensors (taser.huge_pages): when the scripts ask for them, and whether they took."""

import os
import subprocess
import sys

import pytest

from taser import huge_pages


def setting(tmp_path, text: str):
    path = tmp_path / "enabled"
    path.write_text(text)
    return path


def test_kernel_mode_is_the_bracketed_word(tmp_path):
    assert huge_pages.kernel_mode(setting(tmp_path, "always [madvise] never\n")) == "madvise"
    assert huge_pages.kernel_mode(setting(tmp_path, "[always] madvise never\n")) == "always"
    assert huge_pages.kernel_mode(tmp_path / "missing") is None


@pytest.mark.parametrize(("mode", "env", "asked"), [
    ("always madvise [never]", None, False),  # the kernel lends none
    ("always [madvise] never", None, True),
    ("[always] madvise never", None, True),
    ("always [madvise] never", "0", False),  # the environment has the last word
])
def test_request_sets_the_variable_only_where_it_helps(tmp_path, monkeypatch, mode, env, asked):
    if env is None:
        monkeypatch.delenv(huge_pages.ENV, raising=False)
    else:
        monkeypatch.setenv(huge_pages.ENV, env)
    assert huge_pages.request(setting(tmp_path, mode)) is (asked and sys.platform.startswith("linux"))
    assert os.environ.get(huge_pages.ENV) == ("1" if asked and sys.platform.startswith("linux") else env)


def _active_in_child(code: str, env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != huge_pages.ENV}
    if env_value is not None:
        env[huge_pages.ENV] = env_value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(huge_pages.kernel_mode() not in ("always", "madvise"), reason="this kernel lends no transparent huge pages")
def test_the_scripts_entry_point_turns_them_on_before_torch_allocates():
    probe = "import taser.cli, torch; from taser import huge_pages; print(huge_pages.active())"
    assert _active_in_child(probe, None) == "True"
    assert _active_in_child(probe, "0") == "False"
    # too late once torch has allocated: PyTorch reads the setting at its first allocation
    late = "import torch; torch.ones(1 << 20); from taser import huge_pages; huge_pages.request(); print(huge_pages.active())"
    if huge_pages.kernel_mode() == "madvise":
        assert _active_in_child(late, None) == "False"
