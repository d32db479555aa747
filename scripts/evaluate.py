"""`python scripts/evaluate.py ...` from a clone: the command `taser-evaluate` (`python -m taser.evaluate`), whose
module `taser/evaluate.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.evaluate import command

if __name__ == "__main__":
    command()
