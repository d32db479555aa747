"""`python scripts/train_reader.py ...` from a clone: the command `taser-train-reader` (`python -m taser.train_reader`), whose
module `taser/train_reader.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.train_reader import command

if __name__ == "__main__":
    command()
