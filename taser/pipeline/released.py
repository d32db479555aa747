"""A checkpoint named the way a researcher names it: a taser checkpoint directory (trained here or
converted), or a released DPR or TASER model by its hub name, converted into taser's layout once and
kept in the cache (`taser.io.cache_home()/released/`). Checked before any weights load: a path that
does not exist, a directory that is not a checkpoint, and a released model the hub cannot give (no
network, `HF_HUB_OFFLINE=1`) each get one message saying what to do."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from taser.io import atomic_dir, cache_home


class CheckpointUnavailable(ValueError):
    """A checkpoint that cannot be used as named; the message says why and what to run."""


@dataclass(frozen=True)
class Released:
    conversion: str  # import_hf_dpr | import_taser
    source: str  # the question encoder (DPR), or a download resource's name (TASER)
    ctx_source: str | None = None  # DPR's passage encoder
    base_model: str | None = None  # TASER: the BERT its weights belong to

    def how_to_fetch(self) -> str:
        if self.conversion == "import_hf_dpr":
            return f"`hf download {self.source}` and `hf download {self.ctx_source}` where the hub is reachable"
        return f"`taser-download resource={self.source}` and `hf download {self.base_model}` where the network is reachable"


# hub name -> how it becomes a taser checkpoint (a DPR pair is named by either encoder)
RELEASED: dict[str, Released] = {}
for _name in ("single-nq-base", "multiset-base"):
    _pair = Released("import_hf_dpr", f"facebook/dpr-question_encoder-{_name}", f"facebook/dpr-ctx_encoder-{_name}")
    RELEASED[_pair.source] = RELEASED[_pair.ctx_source] = _pair
RELEASED["kelvinih/taser-bert-base-uncased"] = Released("import_taser", "checkpoint.taser.bert-base-uncased", base_model="bert-base-uncased")


def released_dir(name: str) -> Path:
    return cache_home() / "released" / name.replace("/", "--")


def resolve_checkpoint(name: str | os.PathLike, allow_pickle: bool = False) -> Path:
    """The taser checkpoint directory `name` stands for (converting a released model once)."""
    given = Path(os.path.expanduser(str(name)))
    if given.is_dir():
        if not (given / "config.json").is_file():
            raise CheckpointUnavailable(f"checkpoint {given} is not a checkpoint: it holds no config.json (a taser checkpoint directory, "
                                        "e.g. a training run's final/, or a released model's hub name)")
        return given
    release = RELEASED.get(str(name))
    if release is None:
        known = ", ".join(sorted(RELEASED))
        raise CheckpointUnavailable(f"checkpoint {name} does not exist: it is neither a directory nor a released model this library "
                                    f"converts ({known}); another project's checkpoint: see taser-convert-checkpoint")
    target = released_dir(str(name) if release.conversion != "import_hf_dpr" else release.source)
    if (target / "config.json").is_file():
        return target
    if release.conversion == "import_taser" and not allow_pickle:
        raise CheckpointUnavailable(f"{name} is released as a pickle (pytorch_model.bin): loading one runs code from the file; "
                                    "say allow_pickle=true to convert it (once)")
    try:
        with atomic_dir(target) as tmp:
            shutil.rmtree(tmp, ignore_errors=True)  # the converters write their own directory
            _convert(release, tmp, allow_pickle)
    except CheckpointUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 (the hub's and the network's errors are many; each gets the same advice)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointUnavailable(f"{name} could not be fetched and converted ({first}); fetch it once with {release.how_to_fetch()}, "
                                    f"then it converts into {target}") from None
    return target


def _convert(release: Released, output: Path, allow_pickle: bool) -> None:
    if release.conversion == "import_hf_dpr":
        from taser.models.convert.hf_dpr import import_hf_dpr

        import_hf_dpr(release.source, release.ctx_source, output, allow_pickle=allow_pickle)
        return
    from taser.models.convert.taser_release import import_taser_release
    from taser.pipeline.download import fetch
    from taser.pipeline.table import DATA_ROOT

    import_taser_release(fetch(release.source, DATA_ROOT), output, base_model=release.base_model, allow_pickle=allow_pickle)
