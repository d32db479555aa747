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


def cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse avx2 {flags}\n")
    return path


@pytest.mark.parametrize(("mode", "flags", "env", "asked"), [
    ("always madvise [never]", "", None, False),  # the kernel lends none
    ("always [madvise] never", "", None, True),  # fp32 CPU training: measured faster with them
    ("[always] madvise never", "", None, True),
    ("always [madvise] never", "avx512_bf16", None, False),  # native bf16: measured slower
    ("always [madvise] never", "amx_tile", None, False),
    ("always [madvise] never", "", "0", False),  # the environment has the last word
])
def test_request_sets_the_variable_only_where_it_measured_faster(tmp_path, monkeypatch, mode, flags, env, asked):
    if env is None:
        monkeypatch.delenv(huge_pages.ENV, raising=False)
    else:
        monkeypatch.setenv(huge_pages.ENV, env)
    asked = asked and sys.platform.startswith("linux")
    assert huge_pages.request(setting(tmp_path, mode), cpuinfo(tmp_path, flags)) is asked
    assert os.environ.get(huge_pages.ENV) == ("1" if asked else env)


def test_native_bf16_reads_the_flags(tmp_path):
    assert huge_pages.native_bf16(cpuinfo(tmp_path, "avx512f avx512_bf16"))
    assert not huge_pages.native_bf16(cpuinfo(tmp_path, "avx512f"))
    assert not huge_pages.native_bf16(tmp_path / "missing")


def _active_in_child(code: str, env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != huge_pages.ENV}
    if env_value is not None:
        env[huge_pages.ENV] = env_value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(huge_pages.kernel_mode() not in ("always", "madvise"), reason="this kernel lends no transparent huge pages")
def test_the_scripts_entry_point_decides_before_torch_allocates():
    probe = "import taser.cli, torch; from taser import huge_pages; print(huge_pages.active())"
    assert _active_in_child(probe, "1") == "True"
    assert _active_in_child(probe, "0") == "False"
    assert _active_in_child(probe, None) == str(not huge_pages.native_bf16())  # this CPU's default
    # too late once torch has allocated: PyTorch reads the setting at its first allocation
    late = "import torch; torch.ones(1 << 20); import os; os.environ['THP_MEM_ALLOC_ENABLE'] = '1'; from taser import huge_pages; print(huge_pages.active())"
    if huge_pages.kernel_mode() == "madvise":
        assert _active_in_child(late, None) == "False"
