"""Vectors like real passage and question embeddings, in any number: a Gaussian mixture fitted to
the shipped MiniLM's embeddings of the shipped SQuAD passages (and, for queries, questions).

i.i.d. Gaussian vectors are the worst case for approximate search (no clusters, every neighbour
nearly as far as any other), so they understate the recall that HNSW and IVF reach on real
embeddings. Here k-means finds the clusters of the real vectors; each sample is a cluster mean
plus the residual covariance shared by all clusters (full rank, from the real residuals, shrunk
towards its diagonal), scaled by the cluster's own spread; then unit length, like the model's.

Widths: 384 is MiniLM's own vector ([CLS]-free mean pooling, unit length, as the model is
used). For 768 (BERT-base width) there is no BERT-base model here, so the fitted vector is the
concatenation of two real views of the same text: the final layer's mean pooling and the third
layer's, each unit length, then unit length together.
"""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import torch

from taser.models.pretrained import SHIPPED_MODEL, resolve_pretrained


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


@torch.inference_mode()
def real_embeddings(texts: list[str], width: int, batch_size: int = 64, max_length: int = 256) -> np.ndarray:
    from transformers import AutoModel, AutoTokenizer

    path = resolve_pretrained(SHIPPED_MODEL)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    out = []
    for i in range(0, len(texts), batch_size):
        batch = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        states = model(**batch, output_hidden_states=True).hidden_states
        final = _mean_pool(states[-1], batch["attention_mask"])
        if width == final.shape[1]:
            out.append(final)
        elif width == 2 * final.shape[1]:
            out.append(torch.nn.functional.normalize(torch.cat([final, _mean_pool(states[3], batch["attention_mask"])], 1), dim=-1))
        else:
            raise ValueError(f"width {width}: expected {final.shape[1]} or {2 * final.shape[1]}")
    return torch.cat(out).numpy().astype(np.float32)


class Mixture:
    def __init__(self, means: np.ndarray, scales: np.ndarray, weights: np.ndarray, cholesky: np.ndarray):
        self.means, self.scales, self.weights, self.cholesky = means, scales, weights, cholesky

    @classmethod
    def fit(cls, real: np.ndarray, clusters: int = 32, shrink: float = 0.1, seed: int = 0) -> Mixture:
        kmeans = faiss.Kmeans(real.shape[1], clusters, niter=25, seed=seed)
        kmeans.train(real)
        _, assign = kmeans.index.search(real, 1)
        assign = assign[:, 0]
        means = kmeans.centroids.astype(np.float64)
        residuals = real - means[assign]
        spread = np.array([np.sqrt((residuals[assign == c] ** 2).sum(1).mean()) if (assign == c).any() else 1.0 for c in range(clusters)])
        unit = residuals / spread[assign][:, None]  # every cluster's residuals at one scale
        covariance = np.cov(unit, rowvar=False)
        covariance = (1 - shrink) * covariance + shrink * np.diag(np.diag(covariance))
        weights = np.bincount(assign, minlength=clusters) / len(real)
        return cls(means, spread, weights, np.linalg.cholesky(covariance + 1e-9 * np.eye(len(covariance))))

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        picked = rng.choice(len(self.weights), size=count, p=self.weights)
        noise = rng.standard_normal((count, self.cholesky.shape[0])) @ self.cholesky.T
        vectors = self.means[picked] + noise * self.scales[picked][:, None]
        return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)

    def describe(self) -> dict:
        return {"clusters": len(self.weights), "width": int(self.means.shape[1])}


def fitted(texts: list[str], width: int, cache: Path) -> Mixture:
    """The mixture fitted to `texts`' real embeddings; the embeddings are cached in `cache`."""
    if cache.is_file():
        real = np.load(cache)
    else:
        real = real_embeddings(texts, width)
        np.save(cache, real)
    return Mixture.fit(real)
