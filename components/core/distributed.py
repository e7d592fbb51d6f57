"""Which process of a distributed launch this is, so that side effects happen once.

`torchrun`, `accelerate launch` and the PyTorchJob operator all export RANK / WORLD_SIZE / LOCAL_RANK;
transformers' Trainer (through accelerate) joins the process group itself. Stages only need to know
whether they are the main process: that one alone opens the MLflow run, writes checkpoints and
results. Reading the environment (not `torch.distributed`) works before the group exists, which is
when a stage opens its MLflow run.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field


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


class LaunchConfig(BaseModel):
    """How many processes a training stage runs in: one pod, or a PyTorchJob of nodes x processes.

    Read by the pipelines (`pipelines/stages.py`): a stage whose `processes` is above 1 is compiled as a
    Kubeflow PyTorchJob (KFP: a launcher step; Argo: a resource template) instead of a single pod."""

    model_config = ConfigDict(extra="forbid")
    nproc_per_node: int = Field(1, ge=1, description="Processes per node (torchrun --nproc-per-node; GPUs per node).")
    workers: int = Field(0, ge=0, description="Nodes besides the master (PyTorchJob Worker replicas).")

    @property
    def nodes(self) -> int:
        return 1 + self.workers

    @property
    def processes(self) -> int:
        """The world size of the launch."""
        return self.nproc_per_node * self.nodes
