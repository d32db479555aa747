"""`python scripts/search.py ...` from a clone: the command `taser-search` (`python -m taser.search`), whose
module `taser/search.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.search import command

if __name__ == "__main__":
    command()
