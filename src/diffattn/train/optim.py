"""AdamW with decoupled weight decay only on weight matrices, warm-up + cosine schedule, and an EMA of weights."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import OptimConfig

__all__ = ["NO_DECAY_KEYWORDS", "param_groups", "build_optimizer", "warmup_cosine", "build_scheduler", "EMA"]

#: parameters whose name contains one of these get no weight decay (besides every parameter with ndim < 2):
#: λ parameters, attention gates (not the SwiGLU MLP gate), norms, biases, the CLIP temperature and the
#: position / class embeddings (as timm)
NO_DECAY_KEYWORDS = ("lambda", "attn.gate", "norm", "bias", "logit_scale", "pos_embed", "cls_token", "ln_")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decayed weight matrices, and everything in :data:`NO_DECAY_KEYWORDS` or of ndim < 2.
    Frozen parameters (``requires_grad=False``) are left out."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        lname = name.lower()
        if p.ndim < 2 or any(k in lname for k in NO_DECAY_KEYWORDS):
            no_decay.append(p)
        else:
            decay.append(p)
    if not decay and not no_decay:
        raise ValueError("the model has no trainable parameters (every requires_grad is False)")
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) over :func:`param_groups`."""
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_lr_ratio: float = 0.0) -> float:
    """The lr multiplier at optimizer step ``step`` (0-based): (step + 1) / warmup during warm-up, then
    m + (1 − m)·½(1 + cos(π·p)), p = (step − warmup) / (total − warmup) ∈ [0, 1], m = ``min_lr_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    p = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, total_steps, cfg.warmup_steps, cfg.min_lr_ratio))


class EMA:
    """Exponential moving average of the weights (Polyak & Juditsky 1992): θ̄ ← d·θ̄ + (1 − d)·θ after each step;
    buffers are copied. ``state_dict`` / ``load_state_dict`` for checkpoints, :meth:`copy_to` for the final save."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.shadow = {k: v.detach().clone().float() if v.is_floating_point() else v.detach().clone()
                       for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for k, v in model.state_dict().items():
            s = self.shadow[k]
            if v.is_floating_point():
                s.mul_(self.decay).add_(v.detach().float(), alpha=1 - self.decay)
            else:
                s.copy_(v)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != set(self.shadow):
            raise ValueError(f"EMA state does not match the model: {sorted(set(state) ^ set(self.shadow))[:5]}")
        for k, v in state.items():
            self.shadow[k].copy_(v)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        model.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in self.shadow.items()})
