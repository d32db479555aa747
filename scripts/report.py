"""`python scripts/report.py ...` from a clone: the command `taser-report` (`python -m taser.report`), whose
module `taser/report.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.report import command

if __name__ == "__main__":
    command()
