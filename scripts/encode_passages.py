"""`python scripts/encode_passages.py ...` from a clone: the command `taser-encode-passages` (`python -m taser.encode_passages`), whose
module `taser/encode_passages.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.encode_passages import command

if __name__ == "__main__":
    command()
