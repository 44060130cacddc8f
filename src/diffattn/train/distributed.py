"""Process group set-up for torchrun (gloo on CPU, nccl on CUDA), DDP or FSDP2 wrapping, metric reduction."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..utils import resolve_device

__all__ = ["DistEnv", "init_distributed", "wrap_model", "all_reduce_mean", "reduce_ignored_grads", "barrier"]


@dataclass
class DistEnv:
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


def init_distributed(device: str | None = None, what: str = "run.device") -> DistEnv:
    """Read torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, pick the device (``device``: ``cpu``, ``cuda``,
    ``cuda:N`` or None for CUDA when available; :func:`diffattn.utils.resolve_device`, whose errors name ``what``)
    and start the process group (nccl on CUDA, else gloo) when there is more than one process. A single process
    needs no environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, what, local_rank=local, world_size=world)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return DistEnv(rank, world, local, dev)


def wrap_model(model: nn.Module, env: DistEnv, strategy: str) -> nn.Module:
    """DDP (default) or FSDP2 ``fully_shard`` (each transformer block, then the root). One process: unchanged."""
    if not env.distributed:
        return model
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        # FSDP2 cannot shard 0-d parameters (CLIP's logit_scale): they stay replicated and their gradients are
        # averaged by :func:`reduce_ignored_grads`
        ignored = {p for p in model.parameters() if p.ndim == 0}
        for m in list(model.modules()):
            if isinstance(getattr(m, "blocks", None), nn.ModuleList):
                for blk in m.blocks:
                    fully_shard(blk)
        fully_shard(model, ignored_params=ignored or None)
        model._diffattn_fsdp_ignored = sorted(ignored, key=id)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [env.device.index] if env.device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean over ranks (identity with one process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        x /= dist.get_world_size()
    return x


def reduce_ignored_grads(model: nn.Module) -> None:
    """Average over ranks the gradients of the parameters FSDP2 left replicated (see :func:`wrap_model`)."""
    for p in getattr(model, "_diffattn_fsdp_ignored", ()):
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= dist.get_world_size()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
