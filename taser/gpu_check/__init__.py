"""The GPU check (`scripts/gpu_check.py`, `make gpu-check`): correctness and speed of training and
encoding on a machine's GPUs, against the CPU in fp32. `run_gpu_check` is the entry point.

- `job`: the settings (`configs/gpu_check.yaml`);
- `data`, `sizes`: the shipped SQuAD data and the model sizes, prepared once;
- `training`, `encoding`: measurements on one device; `probe`: one (model type, size), the loss check;
- `ddp`: the same on every GPU under torchrun; `report`: results.json and results.md;
- `check`: the whole check, in order.
"""

from taser.gpu_check.check import GpuCheckFailed, run_gpu_check
from taser.gpu_check.job import GpuCheckJob

__all__ = ["GpuCheckFailed", "GpuCheckJob", "run_gpu_check"]
