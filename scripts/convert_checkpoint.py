"""`python scripts/convert_checkpoint.py ...` from a clone: the command `taser-convert-checkpoint` (`python -m taser.convert_checkpoint`), whose
module `taser/convert_checkpoint.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.convert_checkpoint import command

if __name__ == "__main__":
    command()
