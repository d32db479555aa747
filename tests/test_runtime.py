"""`precision: auto` and the hardware facts: the rule on each kind of hardware (capability checks
faked), the warning for emulated bf16, and that runs record what they resolved."""

import json
import logging
import os
import platform

import pytest
import torch

from taser import runtime
from taser.runtime import autocast, grad_scaler, precision_record, resolve_precision


@pytest.fixture
def fake_hardware(monkeypatch):
    """Set what the machine has: `fake_hardware(cpu_bf16=..., cuda_bf16=...)`."""

    def set_(cpu_bf16: bool = False, cuda_bf16: bool = False):
        monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: cpu_bf16)
        monkeypatch.setattr(runtime, "cuda_has_bf16", lambda: cuda_bf16)
        monkeypatch.setattr(runtime, "_warned", set())

    return set_


@pytest.mark.parametrize(
    "device, cpu_bf16, cuda_bf16, expected",
    [
        ("cuda", False, True, "bf16"),   # Ampere and later
        ("cuda", False, False, "fp16"),  # V100, T4: fp16 with a gradient scaler
        ("cpu", True, False, "bf16"),    # AVX512-BF16 or AMX
        ("cpu", False, False, "fp32"),   # AVX2-only (Zen 3, most laptops): bf16 would be emulated
        ("mps", False, False, "fp32"),
    ],
)
def test_auto_follows_the_hardware(fake_hardware, device, cpu_bf16, cuda_bf16, expected):
    fake_hardware(cpu_bf16=cpu_bf16, cuda_bf16=cuda_bf16)
    assert resolve_precision("auto", torch.device(device)) == expected


def test_explicit_precision_is_honoured(fake_hardware):
    fake_hardware(cpu_bf16=True, cuda_bf16=True)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [resolve_precision(p, cpu) for p in ("fp32", "bf16")] == ["fp32", "bf16"]
    assert [resolve_precision(p, cuda) for p in ("fp32", "bf16", "fp16")] == ["fp32", "bf16", "fp16"]


def test_bf16_on_a_cpu_without_it_warns_once(fake_hardware, caplog):
    fake_hardware(cpu_bf16=False)
    with caplog.at_level(logging.WARNING, logger="taser.runtime"):
        assert resolve_precision("bf16", "cpu") == "bf16"
        assert resolve_precision("bf16", "cpu") == "bf16"
        with autocast("bf16", torch.device("cpu")):
            pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "without native bf16" in warnings[0] and "precision=auto" in warnings[0]
    assert torch.backends.cpu.get_cpu_capability() in warnings[0]


def test_no_warning_where_bf16_is_native_or_auto(fake_hardware, caplog):
    with caplog.at_level(logging.WARNING, logger="taser.runtime"):
        fake_hardware(cpu_bf16=True)
        resolve_precision("bf16", "cpu")
        fake_hardware(cpu_bf16=False)
        resolve_precision("auto", "cpu")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_bad_precisions_are_clear_errors(fake_hardware):
    fake_hardware()
    with pytest.raises(ValueError, match="unknown precision 'bf61'.*auto, fp32, bf16, fp16"):
        resolve_precision("bf61", "cpu")
    with pytest.raises(ValueError, match="fp16 needs a CUDA GPU"):
        resolve_precision("fp16", "cpu")


def test_native_bf16_check_reads_torchs_cpu_checks(monkeypatch):
    for avx512_bf16, amx, expected in ((False, False, False), (True, False, True), (False, True, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert runtime.cpu_has_native_bf16() is expected


def test_autocast_and_scaler_follow_the_resolved_precision(fake_hardware):
    fake_hardware(cpu_bf16=False)
    cpu = torch.device("cpu")
    x = torch.randn(4, 4)
    with autocast("auto", cpu):
        assert (x @ x).dtype == torch.float32
    fake_hardware(cpu_bf16=True)
    with autocast("auto", cpu):
        assert (x @ x).dtype == torch.bfloat16
    assert grad_scaler("auto", cpu) is None


def test_precision_record_names_the_machine(fake_hardware):
    fake_hardware(cpu_bf16=False)
    record = precision_record("auto", "cpu")
    assert record["precision_requested"] == "auto" and record["precision"] == "fp32"
    hw = record["hardware"]
    assert hw["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert hw["cpu"] and hw["cores"] >= 1 and hw["device"] == "cpu" and hw["cpu_native_bf16"] is False
    json.dumps(record)  # written into results.json and train_summary.json


def test_training_records_the_resolved_precision(fake_hardware, tmp_path, tiny_pretrained, mini_squad):
    from conftest import tiny_model_cfg

    from taser.pipeline.train import run_training

    fake_hardware(cpu_bf16=False)
    train = {"batch_size": 4, "max_steps": 2, "warmup_steps": 1, "val_max_questions": 0, "progress": False, "log_every": 1}
    run_training(tiny_model_cfg(tiny_pretrained), [str(mini_squad / "train.json")], train, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["config"]["precision"] == "auto"
    assert summary["runtime"]["precision"] == "fp32" and summary["runtime"]["hardware"]["cpu_capability"]
    untuned = not any(k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "TASER_KEEP_FREED_MEMORY") for k in os.environ)
    if platform.libc_ver()[0] == "glibc" and untuned:
        assert summary["runtime"]["hardware"]["freed_memory_kept"] is True  # the trainer kept freed memory (taser.runtime.training_record)
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["precision"] for r in log] == ["fp32", "fp32"]
    state = torch.load(tmp_path / "run" / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert state["extra"]["runtime"]["precision"] == "fp32"


@pytest.fixture
def torchrun(monkeypatch):
    """Fake a torchrun process (`torchrun(local_rank, gpus)`) on a machine with `gpus` GPUs."""

    def set_(local_rank: int, gpus: int, world_size: int = 8):
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        monkeypatch.setenv("RANK", str(local_rank))
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)

    return set_


def test_each_torchrun_process_takes_the_gpu_of_its_local_rank(torchrun):
    """Would catch every rank landing on GPU 0 (`cuda` without an index) under torchrun."""
    from taser.runtime import pick_device

    torchrun(local_rank=5, gpus=8)
    assert pick_device("auto") == pick_device("cuda") == pick_device("cuda:5") == torch.device("cuda", 5)
    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device=cuda:0 contradicts this process's LOCAL_RANK=5"):
        pick_device("cuda:0")
    torchrun(local_rank=3, gpus=2)
    with pytest.raises(ValueError, match="LOCAL_RANK=3 but this machine shows 2 GPU"):
        pick_device("auto")
    torchrun(local_rank=0, gpus=0)
    assert pick_device("auto") == torch.device("cpu")


def test_a_rank_given_one_gpu_of_its_own_takes_it(torchrun):
    """Would catch a rank under SLURM's --gpus-per-task=1 (or CUDA_VISIBLE_DEVICES set per rank),
    which sees one GPU at LOCAL_RANK >= 1, refused instead of taking its GPU."""
    from taser.runtime import pick_device

    torchrun(local_rank=3, gpus=1)
    assert pick_device("auto") == pick_device("cuda") == pick_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="device=cuda:3 contradicts"):
        pick_device("cuda:3")
    torchrun(local_rank=0, gpus=1)
    assert pick_device("auto") == torch.device("cuda", 0)


def test_one_process_keeps_the_device_it_names(monkeypatch):
    from taser.runtime import pick_device

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("cuda:1") == torch.device("cuda", 1) and pick_device("auto") == torch.device("cuda")


def test_explicit_bf16_on_a_gpu_without_it_warns_once(fake_hardware, monkeypatch, caplog):
    fake_hardware(cuda_bf16=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    with caplog.at_level(logging.WARNING, logger="taser.runtime"):
        assert resolve_precision("bf16", torch.device("cuda")) == "bf16"
        resolve_precision("bf16", torch.device("cuda"))
    assert [r.message.count("Tesla V100") for r in caplog.records] == [1]


def test_only_a_cpu_training_run_keeps_freed_memory(fake_hardware, monkeypatch):
    """Would catch `keep_freed_memory` (process-wide, never undone) applied in a GPU run, where the
    host's malloc is not the bottleneck: only a CPU run's training record makes it so."""
    import functools

    for key in ("WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    fake_hardware(cuda_bf16=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    calls = []
    monkeypatch.setattr(runtime, "keep_freed_memory", functools.cache(lambda: calls.append("kept") or True))
    gpu = runtime.training_record("auto", torch.device("cuda"))
    assert calls == [] and gpu["precision"] == "bf16"
    assert gpu["hardware"]["device"] == "cuda" and gpu["hardware"]["gpu"] == "NVIDIA H200" and gpu["hardware"]["freed_memory_kept"] is False
    cpu = runtime.training_record("auto", torch.device("cpu"))
    assert calls == ["kept"] and cpu["hardware"]["freed_memory_kept"] is True


def _child(code: str, *args: str, **env: str) -> list[str]:
    """Run `code` in a fresh Python (glibc's malloc untuned, huge-page tensors off unless `env`
    says otherwise); its printed words."""
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "TASER_KEEP_FREED_MEMORY")}
    run = subprocess.run([sys.executable, "-c", code, *args], env={**clean, "THP_MEM_ALLOC_ENABLE": "0", **env},
                         capture_output=True, text=True, check=True)
    return run.stdout.split()


_HUGE_PAGE_PROBE = "from taser.runtime import huge_page_tensors; print(huge_page_tensors())"


def _kernel_lends_huge_pages_on_request() -> bool:
    try:
        return "[madvise]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


@pytest.mark.skipif(not _kernel_lends_huge_pages_on_request(), reason="needs a kernel lending transparent huge pages on request (madvise)")
def test_hardware_records_whether_the_environment_put_tensors_on_huge_pages():
    assert _child(_HUGE_PAGE_PROBE, THP_MEM_ALLOC_ENABLE="1") == ["True"]
    assert _child(_HUGE_PAGE_PROBE, THP_MEM_ALLOC_ENABLE="0") == ["False"]


_FAULTS_OF_A_48_MB_BLOCK = """
import resource, sys, torch
from taser import runtime
kept = runtime.training_record("fp32", torch.device("cpu"))["hardware"]["freed_memory_kept"] if sys.argv[1] == "train" else False
faults = []
for i in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    # a page smaller each time, as a training step's activations vary with its batch: torch's
    # 64-byte-aligned request of exactly a freed block's size may not fit the hole it left (glibc
    # asks for the size plus the alignment), which grows the heap in some processes and not others
    block = torch.ones((48 << 20) - i * 4096, dtype=torch.uint8)
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
# kept, every later block reuses a freed one; not kept, every block is mapped afresh
print(kept, runtime.freed_memory_kept(), max(faults[1:]))
"""


glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc (mallopt)")


@glibc_only
def test_a_cpu_training_run_keeps_freed_memory_and_reuses_it_without_page_faults():
    pages = (48 << 20) // 4096
    kept, recorded, faults = _child(_FAULTS_OF_A_48_MB_BLOCK, "train")
    _, _, default_faults = _child(_FAULTS_OF_A_48_MB_BLOCK, "no")
    assert kept == recorded == "True"
    assert int(faults) < pages // 8
    if int(default_faults) >= pages // 2:  # not where the kernel backs every fresh block with huge pages
        assert int(faults) < int(default_faults) // 8


@glibc_only
@pytest.mark.parametrize("env", [{"TASER_KEEP_FREED_MEMORY": "0"}, {"MALLOC_TRIM_THRESHOLD_": str(128 << 10)}])
def test_keeping_freed_memory_yields_to_the_environment(env):
    kept, recorded, _ = _child(_FAULTS_OF_A_48_MB_BLOCK, "train", **env)
    assert kept == recorded == "False"


@glibc_only
def test_kept_memory_does_not_fool_the_huge_page_probe():
    """The probe counts a fresh block's faults: it runs before freed memory is kept, not after."""
    code = ("import torch; from taser import runtime; runtime.keep_freed_memory(); "
            "b = torch.ones(100 << 20, dtype=torch.uint8); del b; print(runtime.huge_page_tensors())")
    assert _child(code) == _child(_HUGE_PAGE_PROBE)  # "False" where the kernel lends huge pages only on request
