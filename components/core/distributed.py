"""Which process of a distributed launch this is, so that side effects happen once.

`torchrun`, `accelerate launch` and the PyTorchJob operator all export RANK / WORLD_SIZE / LOCAL_RANK;
transformers' Trainer (through accelerate) joins the process group itself. Stages only need to know
whether they are the main process: that one alone opens the MLflow run, writes checkpoints and
results. Reading the environment (not `torch.distributed`) works before the group exists, which is
when a stage opens its MLflow run.
"""

from __future__ import annotations

import os


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (no-op outside a process group): e.g. before others read what rank 0 wrote."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
