"""Validation during training: the training loss (`val_nll` or `val_triplet`) on held-out batches and DPR's average rank of the positive."""

from __future__ import annotations

import numpy as np
import torch

from taser.models.encoding import encode_texts
from taser.runtime import autocast
from taser.training.batching import collate, example_rng, gold_negatives, make_example
from taser.training.loss import retrieval_loss, similarity_scores


@torch.no_grad()
def validate(model, tokenizer, records, cfg, device: torch.device) -> dict[str, float]:
    """`records`: a sequence of bi-encoder records with positives (the first `val_max_questions`)."""
    n = min(len(records), cfg.val_max_questions)
    if n == 0:
        return {}
    # a seeded random subset: consecutive records share articles and often the same positive,
    # which would turn in-batch negatives into copies of the positive
    chosen = np.random.default_rng(cfg.seed).permutation(len(records))[:n]
    examples = [make_example(records[int(i)], cfg.hard_negatives, cfg.other_negatives, example_rng(cfg.seed, 0, -1, int(i)),
                             gold_negatives(records, int(i), cfg.gold_negatives, cfg.seed, -1)) for i in chosen]
    was_training = model.training
    model.eval()
    loss_config = cfg.loss_config(model.config)
    nll_sum, correct = 0.0, 0
    for b in range(0, n, cfg.batch_size):
        batch = collate(examples[b : b + cfg.batch_size], tokenizer, model.config.max_question_length, model.config.max_length).to(device)
        with autocast(cfg.precision, device):
            out = model(batch.questions, batch.passages)
        nll, ok = retrieval_loss(out.questions, out.passages, batch.positive_idx, batch.ctx_owner, loss_config)
        nll_sum += float(nll.sum())
        correct += int(ok.sum())
    # average rank: every question against the pool of all questions' passages
    ctxs = [c for e in examples for c in e.passages]
    positive = np.cumsum([0] + [len(e.passages) for e in examples[:-1]])
    kw = dict(batch_size=cfg.val_batch_size, precision=cfg.precision, device=device)
    qv = encode_texts(model, tokenizer, [e.question for e in examples], "question", **kw)
    pv = encode_texts(model, tokenizer, [(c.get("title", "") or "", c["text"]) for c in ctxs], "passage", **kw)
    scores = similarity_scores(torch.from_numpy(qv), torch.from_numpy(pv), model.config.similarity)
    gold = scores[torch.arange(n), torch.from_numpy(positive)]
    ranks = (scores > gold[:, None]).sum(1).float()
    model.train(was_training)
    return {f"val_{loss_config.loss}": nll_sum / n, "val_acc": correct / n, "val_avg_rank": float(ranks.mean())}
