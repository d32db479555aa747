"""`python scripts/download.py ...` from a clone: the command `taser-download` (`python -m taser.download`), whose
module `taser/download.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.download import command

if __name__ == "__main__":
    command()
