"""`python scripts/gpu_check.py ...` from a clone: the command `taser-gpu-check` (`python -m taser.gpu_check`), whose
module `taser/gpu_check/__main__.py` says what it does and takes the same settings."""

import _environment  # noqa: F401  (first: a Python without taser's environment is told how to get it)

from taser.gpu_check.__main__ import command

if __name__ == "__main__":
    command()
