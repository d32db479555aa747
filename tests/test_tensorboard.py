"""Training curves: `train.tensorboard=true` writes TensorBoard event files that TensorBoard's own
reader finds, with the loss, learning rate, in-batch accuracy, routing losses and validation of
`train_log.jsonl`; a killed and resumed run leaves one curve, not two."""

import json

import pytest
from conftest import tiny_model_cfg

from taser.pipeline.train import run_training
from taser.training.tensorboard import SUBDIR, tag_of

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

TRAIN = dict(batch_size=4, hard_negatives=1, learning_rate=1e-3, warmup_steps=1, max_steps=4, log_every=1, eval_every=2, save_every=2,
             val_max_questions=8, progress=False, seed=3, tensorboard=True)


def scalars(log_dir):
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def train_log(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_tag_names():
    assert tag_of("loss") == "train/loss" and tag_of("acc") == "train/in_batch_accuracy" and tag_of("lr") == "train/lr"
    assert tag_of("aux_load_balance") == "routing/load_balance" and tag_of("val_nll") == "val/nll"
    assert tag_of("precision") is None and tag_of("step") is None


def test_events_hold_the_training_log(tmp_path, tiny_pretrained, mini_squad):
    model = tiny_model_cfg(tiny_pretrained, "taser", taser={"specialize_every": 1, "routing": "learned_sequence", "load_balance_weight": 0.01})
    out = tmp_path / "run"
    run_training(model, [str(mini_squad / "train.json")], TRAIN, out, dev_file=str(mini_squad / "dev.json"))
    assert list((out / SUBDIR).glob("events.out.tfevents.*"))
    curves = scalars(out / SUBDIR)
    log = train_log(out)
    assert [step for step, _ in curves["train/loss"]] == [1, 2, 3, 4]
    for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("train/in_batch_accuracy", "acc"), ("train/grad_norm", "grad_norm")):
        assert [v for _, v in curves[tag]] == pytest.approx([r[key] for r in log], rel=1e-6), tag
    routing = [tag for tag in curves if tag.startswith("routing/")]
    assert routing and all(len(curves[tag]) == 4 for tag in routing)
    assert [step for step, _ in curves["val/nll"]] == [2, 4]  # eval_every=2
    assert {"val/acc", "val/avg_rank"} <= set(curves)


def test_off_by_default_and_one_curve_after_resume(tmp_path, tiny_pretrained, mini_squad):
    model = tiny_model_cfg(tiny_pretrained, "dpr")
    train = [str(mini_squad / "train.json")]
    run_training(model, train, {**TRAIN, "tensorboard": False, "max_steps": 1}, tmp_path / "off")
    assert not (tmp_path / "off" / SUBDIR).exists()

    def crash(step, record):
        if step == 3:  # after the checkpoint of step 2; step 3's events were written
            raise KeyboardInterrupt

    out = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        run_training(model, train, TRAIN, out, on_step=crash)
    run_training(model, train, {**TRAIN, "resume": True}, out)
    loss = scalars(out / SUBDIR)["train/loss"]
    assert [step for step, _ in loss] == [1, 2, 3, 4]  # the killed run's step 3 was purged
    assert [v for _, v in loss] == pytest.approx([r["loss"] for r in train_log(out)], rel=1e-6)
