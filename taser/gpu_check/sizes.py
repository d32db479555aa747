"""The model sizes the GPU check trains, as directories `load_model` reads as `pretrained`, and the
model settings of each (model type, size).

- `minilm`: the shipped all-MiniLM-L6-v2, as it is (mean pooling, normalised);
- `bert-base`: BERT-base's shape (12 layers, hidden 768, 12 heads, FFN 3072) built from MiniLM's
  config with random weights and MiniLM's tokenizer: DPR's and TASER's compute, no download;
- `tiny`: 2 layers, hidden 64 (the tests' model), mean pooling: the CPU dry run.

Random weights are drawn from a fixed seed, once, and saved: every process (the CPU reference,
each torchrun rank) then reads the same weights.
"""

from __future__ import annotations

from pathlib import Path

from taser.gpu_check.job import GpuCheckJob, Size
from taser.models.pretrained import resolve_pretrained
from taser.models.settings import SHIPPED_MODEL

BERT_BASE_SHAPE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}


def _random_bert(directory: Path, shape: dict, seed: int) -> str:
    """A BERT of `shape` on MiniLM's config and tokenizer, random weights from `seed`, saved once."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    if (directory / "config.json").is_file() and (directory / "model.safetensors").is_file():
        return str(directory)
    minilm = resolve_pretrained(SHIPPED_MODEL)
    config = BertConfig.from_pretrained(minilm)
    for key, value in shape.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = BertModel(config)
    tmp = directory.with_name(directory.name + ".tmp")
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(tmp)
    tmp.rename(directory)
    return str(directory)


def model_source(size: Size, work: Path, seed: int) -> str:
    """The `pretrained` directory of `size` (built under `work` when it has random weights)."""
    if size == Size.minilm:
        return resolve_pretrained(SHIPPED_MODEL)
    shape = BERT_BASE_SHAPE if size == Size.bert_base else TINY_SHAPE
    return _random_bert(work / f"{size.value}-random", shape, seed)


def model_settings(job: GpuCheckJob, model_type: str, size: Size, source: str, dropout: float | None = None) -> dict:
    """`load_model` settings of (model type, size); `dropout` None keeps the model's own (0.1)."""
    settings = {
        "model_type": model_type,
        "pretrained": source,
        "max_length": job.max_length,
        "max_question_length": job.max_question_length,
        "dropout": dropout,
    }
    if size == Size.tiny:
        # a random 2-layer BERT gives nearly the same [CLS] vector for every input: the loss would be
        # log(passages) whatever the batch, and the check blind; mean pooling depends on the input
        settings["pooling"] = "mean"
        if model_type == "taser":
            settings["taser"] = {"specialize_every": 1}  # 2 blocks: the top one specialised
    return settings
