"""`python scripts/prepare_squad.py ...` from a clone: the command `taser-prepare-squad` (`python -m taser.prepare_squad`), whose
module `taser/prepare_squad.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.prepare_squad import command

if __name__ == "__main__":
    command()
