"""What every recipe provides to the loop: a model, a training set, a loss, a per-step hook and a final save."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from ...io import atomic_write_dir
from ..config import TrainConfig

__all__ = ["Task", "mean_lambdas"]


@torch.no_grad()
def mean_lambdas(model: nn.Module) -> list[float]:
    """Mean λ of each differential attention layer, in module order (Ye et al. 2024, eq. 2's re-parameterised λ).
    Gated layers (M-DGSA) have an input-dependent gate instead and are left out; retrofitted layers report λ(t)."""
    from ...layers import DiffAttention, GatedDiffAttention

    out = []
    for m in model.modules():
        if isinstance(m, DiffAttention) and not isinstance(m, GatedDiffAttention):
            p = next(m.parameters())
            lam = m.lambda_weights(torch.zeros(1, 1, m.dim, device=p.device, dtype=p.dtype))[1]
            out.append(round(float(torch.as_tensor(lam, dtype=torch.float32).mean()), 5))
    if not out:
        try:
            from ...adapters import adapters, lambda_summary
        except ImportError:  # pragma: no cover
            return out
        if adapters(model):
            out = [round(r["lambda"], 5) for r in lambda_summary(model)]
    return out


class Task:
    """A training recipe. Subclasses set ``name`` and implement :meth:`build_model`, :meth:`dataset`, :meth:`loss`."""

    name = ""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg

    def build_model(self) -> nn.Module:
        from ...models import create_model

        return create_model(self.cfg.model.name, **self.cfg.model.overrides)

    def dataset(self) -> Dataset:
        raise NotImplementedError

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        """The scalar loss of this rank's micro-batch (mean over its samples), computed under autocast."""
        raise NotImplementedError

    def after_step(self, model: nn.Module) -> None:
        """Called on the unwrapped model after every optimizer step (logit-scale clamp, λ schedule, …)."""

    def save_final(self, model: nn.Module, directory: Path) -> Path:
        """Save the trained model with ``save_pretrained`` (atomically) under ``directory/model``."""
        target = Path(directory) / "model"
        with atomic_write_dir(target) as tmp:
            model.save_pretrained(tmp)
        return target
