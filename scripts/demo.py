"""`python scripts/demo.py ...` from a clone: the command `taser-demo` (`python -m taser.demo`), whose
module `taser/demo.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.demo import command

if __name__ == "__main__":
    command()
