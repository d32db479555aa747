"""Progress of long work: a bar on a terminal, a log line now and then everywhere else.

`progress(...)` returns a tqdm. When stderr is a terminal it draws tqdm's bar (count, rate,
elapsed and ETA). Otherwise (a batch job's log, a pipe, a test) it draws nothing and instead logs
one line through `logging` when it starts, at most every `LOG_EVERY` seconds while it runs, and
when it ends: the same count, rate, elapsed time and ETA, so a log file shows where a long stage
is without a line per batch. Every stage that can run for more than a few seconds uses it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable

from tqdm import tqdm

log = logging.getLogger("taser.progress")

LOG_EVERY = 30.0  # seconds between log lines when stderr is not a terminal
_LINE = "{desc}: {n_fmt}/{total_fmt} ({percentage:.0f}%) [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
_LINE_NO_TOTAL = "{desc}: {n_fmt} [{elapsed}, {rate_fmt}{postfix}]"


class _NullStream:
    def write(self, _text: str) -> None:
        pass

    def flush(self) -> None:
        pass


class LoggingBar(tqdm):
    """A tqdm that writes no bar but logs its state (count, rate, ETA) at most every `every` seconds."""

    monitor_interval = 0  # no monitor thread: lines are logged from update() and close() only

    def __init__(self, *args, every: float = LOG_EVERY, logger: logging.Logger | None = None, **kwargs):
        self._logger = logger or log
        total = kwargs.get("total")
        if total is None and args and hasattr(args[0], "__len__"):
            total = len(args[0])
        kwargs.setdefault("bar_format", _LINE if total else _LINE_NO_TOTAL)
        super().__init__(*args, file=_NullStream(), mininterval=every, maxinterval=every, miniters=1, ascii=True, **kwargs)

    def display(self, msg=None, pos=None):  # tqdm calls this on start, on refresh and on close
        self._logger.info("%s", msg or self.format_meter(**self.format_dict))
        return True


def on_terminal(stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _columns() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def progress(
    iterable: Iterable | None = None,
    *,
    total: float | None = None,
    desc: str | None = None,
    unit: str = "it",
    enabled: bool = True,
    unit_scale: bool = False,
    initial: float = 0,
    every: float = LOG_EVERY,
) -> tqdm:
    """A progress bar over `iterable` (or updated by hand, `bar.update(n)`) with rate and ETA.

    On a terminal: tqdm's bar on stderr. Elsewhere: log lines (`taser.progress` logger, INFO) at
    most every `every` seconds, plus one at the start and one at the end. `enabled=False`: a
    disabled tqdm (every call a no-op), for callers that own an outer bar or want quiet.
    """
    common = {"total": total, "desc": desc, "unit": unit, "unit_scale": unit_scale, "initial": initial}
    if not enabled:
        return tqdm(iterable, disable=True, **common)
    if on_terminal():
        if _columns() > 0:
            return tqdm(iterable, mininterval=1.0, dynamic_ncols=True, **common)
        # a pseudo-terminal without a size (0 x 0) would get an empty bar
        return tqdm(iterable, mininterval=1.0, ncols=100, nrows=20, **common)
    return LoggingBar(iterable, every=every, **common)
