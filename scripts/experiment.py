"""`python scripts/experiment.py ...` from a clone: the command `taser-experiment` (`python -m taser.experiment`), whose
module `taser/experiment.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.experiment import command

if __name__ == "__main__":
    command()
