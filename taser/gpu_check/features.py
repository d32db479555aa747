"""The training paths a run on the device can take besides the plain step, each exercised for a few
steps with the check's smallest model, and each checked where the maths allows:

- gradient caching (`grad_cache_chunk`) keeps the whole batch's in-batch negatives, so its first
  loss equals the plain step's; gradient accumulation (`grad_accumulation`, each micro-batch its own
  negatives) equals the same step on the CPU in fp32;
- compiled training (`compile`, GPUs only: compiling takes minutes on a CPU) equals it too;
- learned token routing (TASER's router) trains to finite losses;
- a run stopped after its checkpoint and resumed repeats the uninterrupted run's later losses;
- the reader (DPR's span extractor) trains to finite losses.

Tolerances are the loss check's, by the numerics used (`taser.gpu_check.job.Tolerance`).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.gpu_check.job import GpuCheckJob, Size
from taser.gpu_check.probe import freed_memory_left_alone
from taser.gpu_check.sizes import model_settings
from taser.gpu_check.training import _load, _train_config, release
from taser.training.trainer import Trainer

log = logging.getLogger(__name__)

STEPS = 4
FEATURES = ("gradient caching", "gradient accumulation", "compiled training", "learned token routing", "resume", "reader training")


class _Stop(Exception):
    pass


def _history(job: GpuCheckJob, settings: dict, train_file: str, device: torch.device, precision: str, out: Path, steps: int = STEPS,
             stop_after: int | None = None, **train) -> list[float]:
    model, tokenizer = _load(settings, job.seed)
    cfg = _train_config(job, job.check.batch_size, steps, precision, str(device), 1)
    for key, value in train.items():
        setattr(cfg, key, value)

    def stop(step, record):
        if stop_after is not None and step == stop_after + 1:
            raise _Stop

    trainer = Trainer(model, tokenizer, [BiEncoderJsonFile(train_file)], cfg, out, on_step=stop)
    try:
        return [float(r["loss"]) for r in trainer.train().history]
    finally:
        del trainer, model
        release(device)


def reader_records(train_file: str, questions: int = 16) -> list[dict]:
    """A retriever's output for the reader from the check's bi-encoder JSON: each question's positive
    passage (which holds its answer) and three of its negatives."""
    records = json.loads(Path(train_file).read_text(encoding="utf-8"))[:questions]
    out = []
    for i, r in enumerate(records):
        ctxs = [{**c, "has_answer": True} for c in r["positive_ctxs"][:1]] + [{**c, "has_answer": False} for c in r.get("negative_ctxs", [])[:3]]
        out.append({"question": r["question"], "answers": r["answers"],
                    "ctxs": [{"id": c.get("passage_id") or f"{i}-{j}", "title": c.get("title", ""), "text": c["text"], "score": float(len(ctxs) - j),
                              "has_answer": c["has_answer"]} for j, c in enumerate(ctxs)]})
    return out


def _close(a: float, b: float, tolerance: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= tolerance * max(1.0, abs(b))


def feature_checks(job: GpuCheckJob, source: str, size: Size, train_file: str, device: torch.device, precision: str, numerics: str,
                   work: Path) -> list[dict]:
    """One record per feature: {feature, passed, detail} (or skipped, or error)."""
    tolerance = job.check.tolerance.of(numerics)
    dpr = model_settings(job, "dpr", size, source, dropout=0.0)
    checks = []

    def check(name, run):
        record = {"feature": name}
        try:
            record.update(run())
        except Exception as e:  # noqa: BLE001 - each feature's failure is reported, the others still run
            log.exception("GPU check, %s failed", name)
            record.update(passed=False, error=f"{type(e).__name__}: {e}")
        checks.append(record)

    plain: list[float] = []

    def first_loss_equal(name, **train):
        def run():
            if not plain:
                plain.extend(_history(job, dpr, train_file, device, precision, work / "feature-plain", steps=1))
            other = _history(job, dpr, train_file, device, precision, work / f"feature-{name}", steps=1, **train)[0]
            return {"passed": _close(other, plain[0], tolerance), "detail": f"first loss {other:.6f} vs plain {plain[0]:.6f} ({numerics})"}

        return run

    def accumulation():
        # each micro-batch has its own in-batch negatives, so the step's loss is not the plain step's: the CPU's, in fp32
        train = {"batch_size": job.check.batch_size // 2, "grad_accumulation": 2}
        mine = _history(job, dpr, train_file, device, precision, work / "feature-accumulation", steps=1, **train)[0]
        with freed_memory_left_alone():
            cpu = _history(job, dpr, train_file, torch.device("cpu"), "fp32", work / "feature-accumulation-cpu", steps=1, **train)[0]
        return {"passed": _close(mine, cpu, tolerance), "detail": f"first loss {mine:.6f} vs {cpu:.6f} on the CPU in fp32 ({numerics})"}

    check("gradient caching", first_loss_equal("grad-cache", grad_cache_chunk=max(1, job.check.batch_size // 2)))
    if job.check.batch_size % 2 == 0:
        check("gradient accumulation", accumulation)
    else:
        checks.append({"feature": "gradient accumulation", "skipped": f"check.batch_size={job.check.batch_size} is odd"})
    if device.type == "cuda":
        check("compiled training", first_loss_equal("compiled", compile=True))
    else:
        checks.append({"feature": "compiled training", "skipped": "CPU dry run: compiling takes minutes on a CPU"})

    def routing():
        settings = model_settings(job, "taser", size, source, dropout=0.0)
        settings["taser"] = {**settings.get("taser", {}), "routing": "learned_token"}
        losses = _history(job, settings, train_file, device, precision, work / "feature-routing")
        return {"passed": all(math.isfinite(x) for x in losses) and len(losses) == STEPS, "detail": f"{len(losses)} steps, losses {losses}"}

    check("learned token routing", routing)

    def resume():
        run_settings = {"save_every": 2}
        straight = _history(job, dpr, train_file, device, precision, work / "feature-straight", **run_settings)
        try:
            _history(job, dpr, train_file, device, precision, work / "feature-resumed", stop_after=2, **run_settings)
        except _Stop:
            pass
        resumed = _history(job, dpr, train_file, device, precision, work / "feature-resumed", resume=True, **run_settings)
        later = straight[2:]
        same = len(resumed) == len(later) and all(_close(a, b, tolerance) for a, b in zip(resumed, later))
        return {"passed": same, "detail": f"steps 3-{STEPS}: resumed {resumed} vs uninterrupted {later}"}

    check("resume", resume)

    def reader():
        from taser.pipeline.reader import train_reader
        from taser.reader.config import ReaderModelSettings, ReaderTrainConfig, TrainReaderJob

        retrieval = work / "feature-reader-train.json"
        retrieval.write_text(json.dumps(reader_records(train_file)))
        settings = ReaderTrainConfig(batch_size=2, passages=4, max_steps=STEPS, save_every=0, log_every=1, precision=precision, device=str(device),
                                     progress=False, seed=job.seed)
        model = ReaderModelSettings(pretrained=source, max_length=job.max_length, max_question_length=job.max_question_length)
        result = train_reader(TrainReaderJob(model, settings, str(retrieval), output_dir=str(work / "feature-reader")))
        losses = [float(r["loss"]) for r in result.history]
        return {"passed": len(losses) == STEPS and all(math.isfinite(x) for x in losses), "detail": f"{len(losses)} steps, losses {losses}"}

    check("reader training", reader)
    return checks
