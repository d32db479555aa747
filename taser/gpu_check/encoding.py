"""Encoding throughput on one device: passages/s and questions/s of a bi-encoder (the library's
`encode_passages` / `encode_questions`), and of sentence-transformers on the same model, device
and texts when it is installed (the `peers` extra).

Each timing follows one untimed batch (CUDA context, kernel selection), and ends when the vectors
are on the host, so the GPU's work is inside it.
"""

from __future__ import annotations

import logging
import time

import torch

from taser.models.encoding import encode_passages, encode_questions
from taser.models.inputs import passage_string

log = logging.getLogger(__name__)


def _timed_rate(fn, items: list) -> float:
    """Items per second of `fn(items)`, after `fn` on a first slice to warm up."""
    fn(items[: min(len(items), 64)])
    start = time.perf_counter()
    fn(items)
    return len(items) / max(time.perf_counter() - start, 1e-9)


def encode_figures(model, tokenizer, passages: list, questions: list[str], batch_size: int, precision: str, device: torch.device) -> dict:
    """{"passages_per_s", "questions_per_s"} of the library's encoding of `model` on `device`."""
    model.to(device)
    kwargs = {"batch_size": batch_size, "precision": precision, "device": device}
    figures = {
        "passages_per_s": _timed_rate(lambda ps: encode_passages(model, tokenizer, ps, **kwargs), passages),
        "questions_per_s": _timed_rate(lambda qs: encode_questions(model, tokenizer, qs, **kwargs), questions),
        "passages": len(passages),
        "questions": len(questions),
    }
    log.info("encoded %.1f passages/s, %.1f questions/s (%s, %s)", figures["passages_per_s"], figures["questions_per_s"], precision, device)
    return figures


def peers_installed() -> bool:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def peer_figures(source: str, passages: list, questions: list[str], batch_size: int, precision: str, device: torch.device,
                 max_length: int) -> dict:
    """sentence-transformers' figures for the model in `source`, its weights cast to `precision`
    (its own way to run in bf16/fp16; it has no autocast), the same texts, batch and max length.
    Passages are read as `title [SEP] text`, as the library reads them."""
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(source, device=str(device))
    model.max_seq_length = max_length
    model.to(_DTYPES[precision])
    sep = model.tokenizer.sep_token or "[SEP]"
    texts = [passage_string(p.title, p.text, sep) for p in passages]

    def encode(items):
        return model.encode(items, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)

    figures = {
        "library": f"sentence-transformers {sentence_transformers.__version__}",
        "dtype": precision,
        "passages_per_s": _timed_rate(encode, texts),
        "questions_per_s": _timed_rate(encode, questions),
    }
    log.info("sentence-transformers encoded %.1f passages/s, %.1f questions/s (%s, %s)", figures["passages_per_s"],
             figures["questions_per_s"], precision, device)
    return figures
