"""`python scripts/read.py ...` from a clone: the command `taser-read` (`python -m taser.read`), whose
module `taser/read.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.read import command

if __name__ == "__main__":
    command()
