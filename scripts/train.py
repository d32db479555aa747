"""`python scripts/train.py ...` from a clone: the command `taser-train` (`python -m taser.train`), whose
module `taser/train.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.train import command

if __name__ == "__main__":
    command()
