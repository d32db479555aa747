"""What every script shares: logging to stderr, the config schemas registered with Hydra, and
typed configs (`taser.pipeline.jobs`) from what Hydra composed."""

from __future__ import annotations

import logging
import sys

from taser.shipped import CONFIG_DIR  # noqa: F401  (the scripts import it from here)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: int = logging.INFO) -> None:
    """Log to stderr, and keep the log files already attached (Hydra's `<job dir>/<script>.log`,
    which then holds the job's lines too)."""
    root = logging.getLogger()
    formatter = logging.Formatter(LOG_FORMAT)
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            handler.setFormatter(formatter)
        else:
            root.removeHandler(handler)
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(formatter)
    root.addHandler(stderr)
    root.setLevel(level)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from taser.progress import on_terminal

    if not on_terminal():  # a log: transformers' "Loading weights" and the hub's download bars would add a line per model loaded
        import os

        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when transformers is imported (and by the ranks started later)
        if "transformers" in sys.modules:
            from transformers.utils.logging import disable_progress_bar

            disable_progress_bar()


def exit_on_sigterm() -> bool:
    """SLURM's time limit (and a cancel) sends SIGTERM: exit through Python (SystemExit), so a stage's
    lock is released and its torchrun ranks are stopped. Left alone where a launcher already handles
    SIGTERM (submitit bypasses it on purpose and requeues a preempted job on its own signal): True
    when installed."""
    import signal

    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return False
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return True


def register_schemas() -> None:
    """Store each script's schema in Hydra's ConfigStore; its YAML lists it first in `defaults`."""
    from hydra.core.config_store import ConfigStore

    from taser.pipeline.jobs import SCHEMAS

    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        store.store(name=name, node=schema)


def _unknown_keys(node, path: str = "") -> list[str]:
    """Keys of `node` (and below) outside its schema: Hydra's `+key=value` adds keys even to a
    typed config, and `OmegaConf.to_object` would drop them silently."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    found = []
    if not isinstance(node, DictConfig):
        return found
    schema = OmegaConf.get_type(node)
    fields = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    for key in node.keys():
        where = f"{path}{key}"
        if fields is not None and key not in fields:
            found.append(f"{where} (not a setting of {schema.__name__}; its settings: {', '.join(sorted(fields))})")
        elif not OmegaConf.is_interpolation(node, key) and not OmegaConf.is_missing(node, key):
            found += _unknown_keys(node[key], f"{where}.")
    return found


def typed(cfg):
    """The composed config as its schema's dataclass: keys outside the schema are refused, and
    every `__post_init__` check runs (before any model, data or index is loaded)."""
    from omegaconf import OmegaConf

    unknown = _unknown_keys(cfg)
    if unknown:
        raise ValueError("unknown config key(s): " + "; ".join(unknown))
    return OmegaConf.to_object(cfg)


def user_error(message: str) -> None:
    """A mistake in what the user gave (a setting, a path): one line on stderr, exit status 2, no traceback."""
    print(f"Error: {message}", file=sys.stderr)
    sys.exit(2)


def typed_or_exit(cfg):
    """`typed(cfg)` for a command: a setting its schema refuses (a bad value, a missing path) is one
    message and exit status 2 instead of a traceback."""
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    try:
        return typed(cfg)
    except MissingMandatoryValue as e:
        user_error(f"{e.full_key} has no value: give it on the command line ({e.full_key}=...)")
    except (ValueError, FileNotFoundError, OmegaConfBaseException) as e:
        user_error(str(e))


DATA_HINT = "the shipped SQuAD data: taser-prepare-squad out_dir=outputs/data/squad; DPR's files: taser-download resource=<name> (taser-download lists them)"


def inputs_or_exit(files: dict[str, object], directories: dict[str, str | None] | None = None, hint: str | None = None) -> None:
    """Each named input (setting -> path, or a list of paths; None: not given) checked before any model
    or data loads: the first file that does not exist or is a directory, or directory that does not
    exist or is a file, is one message and exit 2."""
    from pathlib import Path

    wanted = [(setting, path, False) for setting, value in files.items() for path in (value if isinstance(value, (list, tuple)) else [value])]
    wanted += [(setting, path, True) for setting, path in (directories or {}).items()]
    for setting, path, directory in wanted:
        if path is None:
            continue
        found = Path(path).expanduser()
        if not found.exists():
            user_error(f"{setting}={path}: the {'directory' if directory else 'file'} does not exist" + (f" ({hint})" if hint else ""))
        if found.is_dir() != directory:
            user_error(f"{setting}={path}: " + ("is a file, not a directory" if directory else "is a directory, not a file"))


def pretrained_or_exit(name: str) -> None:
    """`model.pretrained` checked before any weights load (`taser.models.pretrained.check_pretrained`)."""
    from taser.models.pretrained import PretrainedUnavailable, check_pretrained

    try:
        check_pretrained(name)
    except PretrainedUnavailable as e:
        user_error(f"model.pretrained={name}: {e}")


def checkpoint_or_exit(name: str, allow_pickle: bool = False) -> str:
    """A command's checkpoint checked before any weights load: a directory as given, a released model's hub name converted
    once into the cache (`taser.pipeline.released`); one line and exit status 2 when it does not exist, is not a
    checkpoint or cannot be fetched."""
    from pathlib import Path

    from taser.pipeline.released import CheckpointUnavailable, resolve_checkpoint

    try:
        found = resolve_checkpoint(name, allow_pickle)
    except CheckpointUnavailable as e:
        user_error(str(e))
    return name if Path(name).expanduser().is_dir() else str(found)


def run_dir() -> str:
    """Hydra's output directory of this job (differs per job under --multirun)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir


register_schemas()
