"""The `data` block of the scripts' configs: where a dataset's files are, and how answers match."""

from __future__ import annotations

from dataclasses import dataclass, field

from taser.choice import Choice


class Match(Choice):
    string = "string"  # DPR's rule: the answer's tokens as a contiguous run of the passage's
    regex = "regex"  # each answer is a regular expression (CuratedTREC)


@dataclass
class DataConfig:
    data_dir: str | None = None
    train_files: list[str] = field(default_factory=list)  # bi-encoder JSON files (several: multi-set)
    sampling_rates: list[float] | None = None  # per training file (multi-set)
    dev_file: str | None = None  # a bi-encoder JSON for validation during training
    passages: str | None = None  # the corpus TSV (id, text, title)
    qa_file: str | None = None  # the evaluation questions (QA TSV)
    match: Match = Match.string

    def __post_init__(self):
        self.match = Match.parse(self.match, "data.match")
        if self.sampling_rates is not None and len(self.sampling_rates) != len(self.train_files):
            raise ValueError(f"data.sampling_rates has {len(self.sampling_rates)} rates for {len(self.train_files)} data.train_files")
