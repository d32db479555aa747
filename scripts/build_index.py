"""`python scripts/build_index.py ...` from a clone: the command `taser-build-index` (`python -m taser.build_index`), whose
module `taser/build_index.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.build_index import command

if __name__ == "__main__":
    command()
