"""`python scripts/mine_negatives.py ...` from a clone: the command `taser-mine-negatives` (`python -m taser.mine_negatives`), whose
module `taser/mine_negatives.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.mine_negatives import command

if __name__ == "__main__":
    command()
