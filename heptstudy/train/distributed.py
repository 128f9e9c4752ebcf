"""torchrun integration: process group set-up from the environment torchrun provides, and the
rank-0 rule for anything written to disk."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from heptstudy.errors import HeptstudyError

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup() -> DistContext:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): gloo on CPU, nccl on
    CUDA and ROCm (RCCL answers to the same name)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cpu")
    if torch.cuda.is_available():  # ROCm builds report through torch.cuda too
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return DistContext(rank=rank, world_size=world, local_rank=local, device=dev)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def decided_on_main(decide: Callable[[], T], ctx: DistContext) -> T:
    """``decide()`` run by rank 0 alone, its answer (or its refusal) given to every rank: a
    decision about files must not depend on which rank looked first."""
    if not ctx.distributed:
        return decide()
    box: list = [None]
    if ctx.is_main:
        try:
            box[0] = (True, decide())
        except HeptstudyError as err:
            box[0] = (False, err)
    dist.broadcast_object_list(box, src=0)
    ok, value = box[0]
    if not ok:
        raise value
    return value


def all_mean(value: float, ctx: DistContext) -> float:
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return float(t.item()) / ctx.world_size


def gather_lists(values: list, ctx: DistContext) -> list[list]:
    """Every rank's list, indexed by rank (a one-element list outside torchrun)."""
    if not ctx.distributed:
        return [values]
    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, values)
    return gathered


def gather_on_main(value: T, ctx: DistContext) -> list[T] | None:
    """Every rank's ``value``, indexed by rank, on rank 0 (the writer); None on the others."""
    if not ctx.distributed:
        return [value]
    gathered: list | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()
