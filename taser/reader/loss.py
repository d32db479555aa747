"""DPR's reader objective (`dpr/models/reader.py`, `compute_loss`), per question:

- selection: cross-entropy of the passage logits, the positive at index 0 among the m passages;
- span: the marginal log-likelihood of all answer spans (s_i, e_i) of the positive passage,
  -log sum_i P_start(s_i) P_end(e_i), where P_start and P_end are softmaxes over the positive
  passage's tokens (DPR's `_calc_mml` over the per-span losses -log P_start(s_i) - log P_end(e_i)).

Summed over the batch's questions, as DPR sums them. Two departures, neither of which changes a
figure when nothing is padded: padding tokens (DPR pads every input to a fixed length and keeps
them in the softmax) and padding passages (a question with fewer than m) are left out, so the loss
of a question does not depend on the others in its batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reader_loss(
    start_logits: torch.Tensor,  # [N, M, L]
    end_logits: torch.Tensor,  # [N, M, L]
    relevance_logits: torch.Tensor,  # [N, M]
    attention_mask: torch.Tensor,  # [N, M, L]
    passage_mask: torch.Tensor,  # [N, M] bool: real passages
    starts: torch.Tensor,  # [N, A] answer starts in the positive passage (index 0)
    ends: torch.Tensor,  # [N, A]
    span_mask: torch.Tensor,  # [N, A] bool: real spans (each question has at least one)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, span loss, selection loss, questions whose positive has the highest selection logit)."""
    neg_inf = torch.finfo(torch.float32).min
    relevance = relevance_logits.float().masked_fill(~passage_mask, neg_inf)
    selection = F.cross_entropy(relevance, torch.zeros(len(relevance), dtype=torch.long, device=relevance.device), reduction="sum")
    tokens = attention_mask[:, 0].bool()
    log_start = F.log_softmax(start_logits[:, 0].float().masked_fill(~tokens, neg_inf), dim=-1)
    log_end = F.log_softmax(end_logits[:, 0].float().masked_fill(~tokens, neg_inf), dim=-1)
    per_span = log_start.gather(1, starts) + log_end.gather(1, ends)  # log P_start(s_i) + log P_end(e_i)
    span = -torch.logsumexp(per_span.masked_fill(~span_mask, float("-inf")), dim=1).sum()
    correct = (relevance.argmax(dim=1) == 0).sum()
    return span + selection, span.detach(), selection.detach(), correct
