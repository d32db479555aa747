"""DPR's experiment settings at tiny scale: a fixed training subset (Figure 1), other questions'
positives as gold negatives (Table 3's 1-of-N "Gold"), cosine that indexes what it trains (Table 6),
and how each is keyed."""

import pytest
import torch
from conftest import tiny_model_cfg

from taser.models.settings import ModelSettings
from taser.pipeline.stage_settings import model_key, train_key
from taser.training.batching import gold_negatives
from taser.training.config import TrainConfig
from taser.training.loader import StepBatches
from taser.training.sampler import MultiSetSchedule
from taser.training.subset import fixed_subset


def records(n: int, shared_positive: tuple[int, int] | None = None) -> list[dict]:
    """n records, record i with positive passage i (records `shared_positive` share one passage)."""
    out = []
    for i in range(n):
        pid = shared_positive[0] if shared_positive and i == shared_positive[1] else i
        out.append({"question": f"question {i}", "answers": [f"a{i}"], "positive_ctxs": [{"title": f"t{pid}", "text": f"passage {pid}",
                    "passage_id": str(pid)}], "negative_ctxs": [], "hard_negative_ctxs": [{"title": "h", "text": f"hard {i}"}]})
    return out


def batches_questions(sets, cfg: TrainConfig, tokenizer, epochs: int) -> list[set[str]]:
    """The questions each epoch's batches hold, decoded from the batches a Trainer's loader builds."""
    sets = fixed_subset(sets, cfg.train_questions, cfg.train_subset, cfg.seed)
    schedule = MultiSetSchedule([len(s) for s in sets], cfg.batch_size, cfg.seed)
    data = StepBatches(sets, schedule, tokenizer, seed=cfg.seed, batch_size=cfg.batch_size, grad_accumulation=1, hard_negatives=0,
                       other_negatives=0, max_question_length=16, max_length=16, total_steps=epochs * schedule.batches_per_epoch)
    seen = [set() for _ in range(epochs)]
    for step in range(len(data)):
        batch = data[step][0]
        texts = tokenizer.batch_decode(batch.questions["input_ids"], skip_special_tokens=True)
        seen[step // schedule.batches_per_epoch].update(texts)
    return seen


# -- a fixed subset -------------------------------------------------------------------------------
def test_a_fixed_subset_is_the_same_questions_at_every_epoch_and_every_resume(tokenizer):
    data = [records(40)]
    first = TrainConfig(train_questions=8, batch_size=4, seed=3)
    epochs = batches_questions(data, first, tokenizer, 3)
    assert epochs[0] == epochs[1] == epochs[2] == {f"question {i}" for i in range(8)}
    seeded = TrainConfig(train_questions=8, train_subset="seeded", batch_size=4, seed=3)
    drawn = batches_questions(data, seeded, tokenizer, 2)
    assert drawn[0] == drawn[1] and len(drawn[0]) == 8 and drawn[0] != epochs[0]
    # a resumed run rebuilds the subset from its settings alone: the same questions
    assert batches_questions(data, seeded, tokenizer, 1)[0] == drawn[0]
    other_seed = batches_questions(data, TrainConfig(train_questions=8, train_subset="seeded", batch_size=4, seed=4), tokenizer, 1)[0]
    assert other_seed != drawn[0]  # N drawn once per seed
    assert batches_questions(data, TrainConfig(train_questions=8, batch_size=4, seed=4), tokenizer, 1)[0] == epochs[0]  # first N: any seed


def test_a_subset_keeps_file_order_and_refuses_what_it_cannot_take():
    (subset,) = fixed_subset([records(30)], 5, "seeded", 1)
    questions = [r["question"] for r in subset]
    assert questions == sorted(questions, key=lambda q: int(q.split()[1])) and len(set(questions)) == 5
    assert fixed_subset([records(3)], None, "first", 1)[0] == records(3)
    with pytest.raises(ValueError, match="train.train_questions=50, but the training set has 30 training questions"):
        fixed_subset([records(30)], 50, "first", 1)
    with pytest.raises(ValueError, match="takes a subset of one training set, and this run has 2"):
        fixed_subset([records(30), records(30)], 5, "first", 1)
    with pytest.raises(ValueError, match="unknown train.train_subset 'random'"):
        TrainConfig(train_questions=5, train_subset="random")
    with pytest.raises(ValueError, match="train.train_questions must be an integer >= 1"):
        TrainConfig(train_questions=0)


def test_training_on_a_subset_end_to_end(tmp_path, tiny_pretrained, mini_squad):
    from taser.pipeline.train import run_training

    train = {"batch_size": 2, "hard_negatives": 1, "max_steps": 3, "warmup_steps": 1, "progress": False, "precision": "fp32", "device": "cpu",
             "val_max_questions": 0, "train_questions": 4, "train_subset": "seeded"}
    result = run_training(tiny_model_cfg(tiny_pretrained), [str(mini_squad / "train.json")], train, tmp_path / "run")
    assert result.steps == 3  # 4 questions = 2 batches an epoch: the run went round the subset
    with pytest.raises(ValueError, match="train.train_questions=100000, but .*train.json has"):
        run_training(tiny_model_cfg(tiny_pretrained), [str(mini_squad / "train.json")], {**train, "train_questions": 100_000}, tmp_path / "big")


# -- gold negatives ---------------------------------------------------------------------------------
def test_gold_negatives_are_other_questions_positives_never_the_questions_own_and_fixed(tokenizer):
    data = records(30, shared_positive=(5, 6))  # record 6's positive is record 5's passage
    for index in range(30):
        gold = gold_negatives(data, index, 7, seed=1, dataset=0)
        ids = [g["passage_id"] for g in gold]
        assert len(ids) == 7 and len(set(ids)) == 7
        assert data[index]["positive_ctxs"][0]["passage_id"] not in ids
        assert all(any(g == r["positive_ctxs"][0] for j, r in enumerate(data) if j != index) for g in gold)
        assert gold == gold_negatives(data, index, 7, seed=1, dataset=0)  # the same at every call (every epoch)
    assert all("5" not in [g["passage_id"] for g in gold_negatives(data, i, 7, 1, 0)] for i in (5, 6))
    assert gold_negatives(data, 0, 7, seed=2, dataset=0) != gold_negatives(data, 0, 7, seed=1, dataset=0)
    assert gold_negatives(data, 0, 0, 1, 0) == []
    assert len(gold_negatives(records(3), 0, 7, 1, 0)) == 2  # fewer when the set has fewer other positives


def test_gold_negatives_join_each_questions_own_group_in_a_batch(tokenizer):
    data = [records(16)]
    schedule = MultiSetSchedule([16], 4, 1)
    steps = StepBatches(data, schedule, tokenizer, seed=1, batch_size=4, grad_accumulation=1, hard_negatives=1, other_negatives=0,
                        max_question_length=16, max_length=16, total_steps=8, gold_negatives=3)
    golds = {}
    for epoch_step in range(8):  # two epochs of 4 batches: every question twice, keeping its gold negatives
        batch = steps[epoch_step][0]
        assert batch.ctx_owner.tolist() == [q for q in range(4) for _ in range(5)]  # positive, 1 hard, 3 gold
        questions = tokenizer.batch_decode(batch.questions["input_ids"], skip_special_tokens=True)
        passages = tokenizer.batch_decode(batch.passages["input_ids"], skip_special_tokens=True)
        for q, question in enumerate(questions):
            own = question.split()[-1]
            group = passages[5 * q : 5 * q + 5]
            assert group[0].endswith(f"passage {own}") and "hard" in group[1]
            gold = [text.split()[-1] for text in group[2:]]
            assert own not in gold and len(set(gold)) == 3 and all(text.split()[-2] == "passage" for text in group[2:])
            assert golds.setdefault(own, gold) == gold
    assert len(golds) == 16  # every question seen (and in the second epoch compared with the first)
    with pytest.raises(ValueError, match="train.gold_negatives must be an integer >= 0"):
        TrainConfig(gold_negatives=-1)


# -- cosine ----------------------------------------------------------------------------------------
def test_cosine_encodes_unit_vectors_so_the_index_searches_what_was_trained(tiny_pretrained, tokenizer):
    from taser.models.config import BiEncoderConfig
    from taser.models.encoding import encode_texts
    from taser.models.loading import load_model

    assert ModelSettings(similarity="cosine").normalize is True
    assert BiEncoderConfig(similarity="cosine").normalize is True
    with pytest.raises(ValueError, match="model.similarity=cosine scores unit vectors, and model.normalize=false would index the raw ones"):
        ModelSettings(similarity="cosine", normalize=False)
    model, tok = load_model({**tiny_model_cfg(tiny_pretrained), "similarity": "cosine", "normalize": None})
    assert model.config.normalize is True
    vectors = encode_texts(model, tok, [("t", "some passage"), ("u", "another one")], "passage", batch_size=2, precision="fp32", device=torch.device("cpu"))
    assert torch.linalg.vector_norm(torch.from_numpy(vectors).float(), dim=-1).tolist() == pytest.approx([1.0, 1.0], abs=1e-5)
    assert model_key({"pretrained": tiny_pretrained, "similarity": "cosine"})["normalize"] is True


# -- keys --------------------------------------------------------------------------------------------
def test_each_new_setting_is_keyed_and_the_defaults_keep_the_keys_made_before_them(tiny_pretrained):
    model = model_key({"pretrained": tiny_pretrained})
    base = train_key({"max_steps": 10}, model, 1, threads=False)
    assert not {"gold_negatives", "loss", "margin", "train_questions", "train_subset"} & set(base)
    explicit = {"gold_negatives": 0, "loss": "nll", "margin": 1.0, "train_questions": None, "train_subset": "seeded"}
    assert train_key({"max_steps": 10, **explicit}, model, 1, threads=False) == base
    assert train_key({"max_steps": 10, "margin": 0.2}, model, 1, threads=False) == base  # the NLL has no margin
    changed = [{"gold_negatives": 7}, {"loss": "triplet"}, {"train_questions": 5}, {"train_questions": 5, "train_subset": "seeded"}]
    keys = [train_key({"max_steps": 10, **c}, model, 1, threads=False) for c in changed]
    keys.append(train_key({"max_steps": 10, "loss": "triplet", "margin": 0.5}, model, 1, threads=False))
    assert all(k != base for k in keys) and len({str(sorted(k.items())) for k in keys}) == len(keys)
    assert keys[1]["temperature"] is None  # the triplet loss has no temperature
