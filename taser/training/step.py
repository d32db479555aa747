"""One training step's forward and backward: plain, compiled (`taser.training.compiled`), or
with gradient caching.

Gradient caching (Gao et al. 2021, "GradCache"): encode the batch without a graph in chunks,
compute the loss on all vectors and its gradient with respect to them, then re-encode chunk by
chunk with a graph and back-propagate those cached vector gradients. Memory then scales with
the chunk, not the batch, and the gradients equal the plain step's (each chunk's random state
is replayed, so dropout draws the same masks in both passes).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from taser.models.routers import AuxLoss
from taser.runtime import autocast, resolve_precision
from taser.training.batching import Batch
from taser.training.distributed import gather_with_grad, no_sync
from taser.training.loss import LossConfig, retrieval_loss

if TYPE_CHECKING:
    from taser.training.compiled import CompiledEncoding


@dataclass
class StepStats:
    """One (micro-)batch's statistics, left on the device (reading them would make the host wait
    for the device): the trainer reads them once per log line."""

    loss_sum: torch.Tensor  # summed NLL over this rank's questions (0-dim, detached)
    correct: torch.Tensor  # in-batch top-1 hits (0-dim)
    questions: int
    aux: dict[str, torch.Tensor]  # unweighted routing losses (0-dim, detached)


def trim_padding(inputs: dict[str, torch.Tensor], lengths: list[int]) -> dict[str, torch.Tensor]:
    """Drop the columns that are padding in every row (inputs are right-padded); `lengths` are
    the rows' real token counts, known on the host, so no device tensor is read."""
    longest = max(lengths, default=0)
    return {k: v[:, :longest] for k, v in inputs.items()}


def _chunks(inputs: dict[str, torch.Tensor], lengths: list[int], size: int) -> list[dict[str, torch.Tensor]]:
    n = len(inputs["input_ids"])
    return [trim_padding({k: v[i : i + size] for k, v in inputs.items()}, lengths[i : i + size]) for i in range(0, n, size)]


class _RandState:
    """The CPU and current-GPU random states, to replay a chunk's dropout exactly."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


class StepRunner:
    def __init__(self, model, loss_config: LossConfig, precision: str, device: torch.device, grad_cache_chunk: int = 0, world_size: int = 1,
                 compiled: CompiledEncoding | None = None):
        """`compiled`: the encoders' pass compiled, on bucketed batches (`taser.training.compiled`)."""
        self.model, self.loss_config, self.device = model, loss_config, device
        self.precision = resolve_precision(precision, device)
        self.chunk = grad_cache_chunk
        self.world_size = world_size
        self.compiled = compiled
        if compiled is not None and grad_cache_chunk:
            raise ValueError("a compiled step runs without gradient caching")

    def _loss(self, q, p, batch: Batch, question_offset: int):
        ctx, ctx_offset = gather_with_grad(p)
        owner, _ = gather_with_grad(batch.ctx_owner + question_offset)
        ids = torch.arange(len(q), device=q.device) + question_offset
        return retrieval_loss(q, ctx, batch.positive_idx + ctx_offset, owner, self.loss_config, ids)

    def _routing_term(self, aux: AuxLoss | None, share: float, scale: float) -> torch.Tensor | float:
        """The one place the routing loss joins the objective: this pass's `share` of it (every
        rank adds its own, hence the division by the world size), times `scale` (1 / gradient
        accumulation steps). 0 without a routing loss."""
        return 0.0 if aux is None else aux.total * (share * scale / self.world_size)

    def run(self, batch: Batch, global_questions: int, question_offset: int = 0, scale: float = 1.0, scaler=None,
            sync: bool = True) -> StepStats:
        """Forward + backward for one (micro-)batch; gradients accumulate in the parameters.

        The NLL is divided by the global number of questions and multiplied by `scale`
        (1 / gradient-accumulation steps), so gradients summed over ranks and micro-batches
        are those of the mean loss over the whole step. `model` may be wrapped in DDP: then
        gradients are summed over ranks during the last backward pass of a call with `sync`.
        """
        if self.chunk and self.chunk > 0:
            return self._run_cached(batch, global_questions, question_offset, scale, scaler, sync)
        passages = len(batch.ctx_owner)
        compiled = nullcontext()
        if self.compiled is not None:
            batch, compiled = self.compiled.bucket(batch), self.compiled.active(self.model)
        with no_sync(self.model, sync):
            with autocast(self.precision, self.device), compiled:
                out = self.model(batch.questions, batch.passages)  # collate pads each side to its longest (compiled: to its bucket)
            # a bucketed batch's dummy passage rows (after the real ones) drop out here
            nll, correct = self._loss(out.questions, out.passages[:passages], batch, question_offset)
            total = nll.sum() / global_questions * scale + self._routing_term(out.aux_loss, 1.0, scale)
            (scaler.scale(total) if scaler is not None else total).backward()
        parts = out.aux_loss.parts if out.aux_loss is not None else {}
        return StepStats(nll.detach().sum(), correct.sum(), len(nll), parts)

    def _encode_chunk(self, chunk: dict, side: str):
        """One chunk through the model's forward (so a DDP wrapper sees every pass)."""
        out = self.model(**{"questions" if side == "question" else "passages": chunk})
        return (out.questions if side == "question" else out.passages).float(), out.aux_loss

    def _encode_chunks(self, chunks, side):
        """First pass of the gradient cache: vectors without a graph (routing losses unused)."""
        states, reps = [], []
        with torch.no_grad(), autocast(self.precision, self.device):
            for chunk in chunks:
                states.append(_RandState(self.device))
                reps.append(self._encode_chunk(chunk, side)[0])
        return states, torch.cat(reps)

    def _run_cached(self, batch: Batch, global_questions: int, question_offset: int, scale: float, scaler=None,
                    sync: bool = True) -> StepStats:
        scaled = scaler.scale if scaler is not None else (lambda t: t)
        q_chunks = _chunks(batch.questions, batch.question_lengths, self.chunk)
        p_chunks = _chunks(batch.passages, batch.passage_lengths, self.chunk)
        q_states, q = self._encode_chunks(q_chunks, "question")
        p_states, p = self._encode_chunks(p_chunks, "passage")
        after_first_pass = _RandState(self.device)
        q.requires_grad_(True)
        p.requires_grad_(True)
        nll, correct = self._loss(q, p, batch, question_offset)
        scaled(nll.sum() / global_questions * scale).backward()  # vector gradients, scaled for fp16
        aux_parts: dict[str, torch.Tensor] = {}
        n_chunks = len(q_chunks) + len(p_chunks)
        done = 0
        for side, chunks, states, grads in (("question", q_chunks, q_states, q.grad), ("passage", p_chunks, p_states, p.grad)):
            start = 0
            for chunk, state in zip(chunks, states):
                n = len(chunk["input_ids"])
                done += 1
                state.restore()
                with no_sync(self.model, sync and done == n_chunks):  # ranks sum gradients once, after the last chunk
                    with autocast(self.precision, self.device):
                        rep, aux = self._encode_chunk(chunk, side)
                    # d(loss)/d(weights) = cached d(loss)/d(vectors) . d(vectors)/d(weights), plus this chunk's routing share
                    surrogate = (rep * grads[start : start + n]).sum()
                    if aux is not None:
                        surrogate = surrogate + scaled(self._routing_term(aux, 1.0 / n_chunks, scale))
                        for k, v in aux.parts.items():
                            aux_parts[k] = aux_parts.get(k, 0.0) + v / n_chunks
                    surrogate.backward()
                start += n
        after_first_pass.restore()
        return StepStats(nll.detach().sum(), correct.sum(), len(nll), aux_parts)
