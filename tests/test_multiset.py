"""Multi-set training (DPR's `data.sampling_rates`): the schedule's rules, and a Trainer run on two files."""

import json
from collections import Counter

import pytest
from conftest import tiny_model_cfg

from taser.data.biencoder_json import BiEncoderJsonFile
from taser.models.loading import load_model
from taser.training.config import TrainConfig
from taser.training.sampler import MultiSetSchedule
from taser.training.trainer import Trainer


def _flat(batches):
    return [pair for batch in batches for pair in batch]


def test_every_batch_comes_from_one_dataset_at_the_rates():
    """Would catch batches that mix datasets, or a dataset given more or fewer batches than its rate."""
    schedule = MultiSetSchedule([40, 30, 17], batch_size=4, seed=1, rates=[1.0, 0.5, 2.0])
    assert schedule.per_dataset == [10, 15 // 4, 34 // 4] == [10, 3, 8]
    for epoch in range(3):
        batches = schedule.epoch(epoch)
        assert len(batches) == schedule.batches_per_epoch == 21
        assert all(len(b) == 4 and len({d for d, _ in b}) == 1 for b in batches)
        assert Counter(b[0][0] for b in batches) == {0: 10, 1: 3, 2: 8}
        # the datasets are interleaved, not one after the other
        sources = [b[0][0] for b in batches]
        assert sources != sorted(sources)


def test_each_example_once_per_epoch_where_the_rate_allows():
    """Would catch repeats within an epoch at rate <= 1, or examples left out of an epoch at rate >= 1."""
    schedule = MultiSetSchedule([12, 20, 6], batch_size=4, seed=5, rates=[1.0, 0.6, 2.0])
    for epoch in range(3):
        seen = {d: Counter(i for dd, i in _flat(schedule.epoch(epoch)) if dd == d) for d in range(3)}
        assert sorted(seen[0]) == list(range(12)) and set(seen[0].values()) == {1}  # rate 1: all, once
        assert len(seen[1]) == 12 and set(seen[1].values()) == {1}  # rate 0.6: 12 of 20, none twice
        assert sorted(seen[2]) == list(range(6)) and set(seen[2].values()) == {2}  # rate 2: all, twice
    # subsampling takes other examples in other epochs
    subsets = {frozenset(i for d, i in _flat(schedule.epoch(e)) if d == 1) for e in range(4)}
    assert len(subsets) > 1
    # a rate of 1.5 takes every example once and half of them a second time
    counts = Counter(i for _, i in _flat(MultiSetSchedule([8], 4, 0, [1.5]).epoch(0)))
    assert sorted(counts) == list(range(8)) and sorted(counts.values()) == [1] * 4 + [2] * 4


def test_schedule_is_a_function_of_seed_and_epoch():
    """Would catch a schedule drawn from global random state (a resumed run would see other batches)."""
    make = lambda seed: MultiSetSchedule([30, 20], batch_size=2, seed=seed, rates=[1.0, 1.5])  # noqa: E731
    assert make(3).epoch(1) == make(3).epoch(1)
    assert make(3).epoch(1) != make(3).epoch(2)
    assert make(3).epoch(1) != make(4).epoch(1)


def test_schedule_refuses_bad_rates():
    """Would catch rates silently ignored or misapplied when they do not fit the files."""
    with pytest.raises(ValueError, match="2 training files but 1 sampling rates"):
        MultiSetSchedule([10, 10], 2, 0, [1.0])
    with pytest.raises(ValueError, match="sampling rates must be > 0"):
        MultiSetSchedule([10, 10], 2, 0, [1.0, 0.0])
    with pytest.raises(ValueError, match="no full batch of 8"):
        MultiSetSchedule([5, 3], 8, 0)


def test_trainer_trains_on_two_files(tmp_path, tiny_pretrained, mini_squad):
    """Would catch a Trainer that reads only the first file, mixes files in a batch, or ignores the rates."""
    files = []
    for tag, source, n in (("alpha", "train.json", 12), ("bravo", "dev.json", 16)):
        records = [BiEncoderJsonFile(mini_squad / source)[i] for i in range(n)]
        for i, r in enumerate(records):  # each question names its file and record (SQuAD repeats some questions)
            r["question"] = f"{tag} {i} {r['question']}"
        (tmp_path / f"{tag}.json").write_text(json.dumps(records))
        files.append(str(tmp_path / f"{tag}.json"))
    model, tokenizer = load_model(tiny_model_cfg(tiny_pretrained, "shared"))
    used = []  # (file, record) of every question the model encodes in training, batch by batch

    def tap(module, args, kwargs):
        questions = args[0] if args else kwargs.get("questions")
        if module.training and questions:
            words = [text.split()[:2] for text in tokenizer.batch_decode(questions["input_ids"], skip_special_tokens=True)]
            used.append([(tag, int(i)) for tag, i in words])

    model.register_forward_pre_hook(tap, with_kwargs=True)
    cfg = TrainConfig.from_value(dict(batch_size=4, hard_negatives=1, learning_rate=1e-3, warmup_steps=1, epochs=2, log_every=1, save_every=0,
                                      val_max_questions=0, progress=False, seed=2, sampling_rates=[1.0, 0.5], precision="fp32", device="cpu"))
    result = Trainer(model, tokenizer, [BiEncoderJsonFile(f) for f in files], cfg, tmp_path / "run").train()
    # per epoch: 12 / 4 = 3 batches of alpha, 16 * 0.5 / 4 = 2 of bravo
    assert result.steps == 10 and len(used) == 10 and all(len(b) == 4 for b in used)
    assert all(len({tag for tag, _ in batch}) == 1 for batch in used)  # one file per batch
    for epoch in (used[:5], used[5:]):
        assert Counter(batch[0][0] for batch in epoch) == {"alpha": 3, "bravo": 2}
        alpha = [i for batch in epoch for tag, i in batch if tag == "alpha"]
        assert sorted(alpha) == list(range(12))  # every record of alpha once per epoch
        bravo = [i for batch in epoch for tag, i in batch if tag == "bravo"]
        assert len(set(bravo)) == 8  # half of bravo, none twice
