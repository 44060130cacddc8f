"""The optimizer step of the package: :func:`run_steps` is the one loop body (the trainer's and :func:`fit`'s), and
:func:`optimizer_step` the one place an optimizer steps.

    losses = fit(model, optimizer, scheduler, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1]))

Per step: zero the gradients, ``accum_steps`` micro-batches (forward under the caller's autocast, backward of
``loss / accum_steps``; DDP syncs gradients on the last one only), clip the global gradient norm, step, advance the
lr schedule, the post-step hooks. :class:`~diffattn.train.loop.Trainer` drives it for a run with a run directory;
:func:`fit` for callers that draw their own batches (the retrofit, noise and synthetic studies, LLaVA's stages).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

__all__ = ["optimizer_step", "run_steps", "fit"]


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, params, grad_clip: float | None,
                   *, scaler: torch.amp.GradScaler | None = None,
                   after_step: Sequence[Callable[[torch.nn.Module], object]] = ()) -> torch.Tensor:
    """One optimizer step on the gradients already in ``params``: unscale (``scaler``), clip the global norm to
    ``grad_clip`` (None: no clipping), step, advance ``scheduler`` (None: none), then each ``after_step(model)``
    (the λ(t) schedule of a retrofit, CLIP's logit-scale clamp). Returns the gradient norm before clipping (0 when
    not clipped). The gradients are left in place; the caller zeroes them."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip) if grad_clip else torch.zeros(())
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    for hook in after_step:
        hook(model)
    return grad_norm


def run_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, batches: Iterable[Any],
              loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], steps: Iterable[int], *, params,
              grad_clip: float | None, accum_steps: int = 1, scaler: torch.amp.GradScaler | None = None,
              autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
              no_sync: Callable[[], contextlib.AbstractContextManager] | None = None, check_finite: bool = False,
              before_step: Sequence[Callable[[torch.nn.Module], object]] = (),
              after_step: Sequence[Callable[[torch.nn.Module], object]] = (),
              on_step: Callable[[int, torch.Tensor, torch.Tensor, float], object] | None = None) -> None:
    """The one loop body of :func:`~diffattn.train.loop.train` and :func:`fit`. Per step of ``steps`` (it stops
    early when ``batches`` runs out): zero the gradients; ``accum_steps`` micro-batches, each ``loss_fn(model,
    batch)`` under ``autocast()`` and backpropagated as ``loss / accum_steps`` (scaled by ``scaler``; every
    micro-batch but the last under ``no_sync()``: DDP's gradient sync); ``before_step`` hooks;
    :func:`optimizer_step` (clip the norm of ``params`` to ``grad_clip``, step, ``scheduler.step()``,
    ``after_step``); then ``on_step(step, mean loss of the micro-batches (a detached tensor), gradient norm, lr the
    step used)``. ``check_finite``: a loss that is not finite is a ``FloatingPointError`` naming the step."""
    batches = iter(batches)
    for step in steps:
        lr = optimizer.param_groups[0]["lr"]
        optimizer.zero_grad(set_to_none=True)
        loss_sum = None
        for a in range(accum_steps):
            try:
                batch = next(batches)
            except StopIteration:
                if a == 0:
                    return
                raise
            sync = no_sync is None or a == accum_steps - 1
            with contextlib.nullcontext() if sync else no_sync():
                with autocast():
                    loss = loss_fn(model, batch)
                if check_finite and not torch.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss.item()} at step {step + 1}; lower optim.lr or "
                                             f"raise optim.warmup_steps")
                scaled = loss / accum_steps
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        for hook in before_step:
            hook(model)
        grad_norm = optimizer_step(model, optimizer, scheduler, params, grad_clip, scaler=scaler,
                                   after_step=after_step)
        if on_step is not None:
            on_step(step, loss_sum / accum_steps, grad_norm, lr)


def fit(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, batches: Iterable[Any],
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], *, grad_clip: float | None = 1.0,
        params: Sequence[torch.nn.Parameter] | None = None,
        after_step: Sequence[Callable[[torch.nn.Module], object]] = (),
        log: Callable[[str], object] | None = None, log_every: int = 50, desc: str = "step",
        total: int | None = None) -> list[float]:
    """One optimizer step per batch of ``batches``, in one process, without a run directory: per batch,
    ``loss = loss_fn(model, batch)``, zero the gradients, backpropagate, then :func:`optimizer_step` (clip the norm
    of ``params`` — default: the parameters that require grad — to ``grad_clip``, step, ``scheduler.step()``,
    ``after_step``). The model is put in train mode first. Returns the loss of every step; ``log`` gets
    ``"{desc} {k}/{total} loss {x}"`` every ``log_every`` steps (``total``: default ``len(batches)`` if it has one).

    The loop body is :func:`~diffattn.train.loop.train`'s (:func:`run_steps`), without what a run adds
    (accumulation, autocast, DDP, checkpoints), for callers that draw their own batches: the retrofit study, LLaVA's
    stages (:func:`diffattn.train.llava.train_llava`)."""
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a callable (model, batch) -> loss, got {type(loss_fn).__name__}")
    if grad_clip is not None and not grad_clip > 0:
        raise ValueError(f"grad_clip must be None or > 0, got {grad_clip!r}")
    params = list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
    if total is None and hasattr(batches, "__len__"):
        total = len(batches)
    losses: list[float] = []

    def on_step(step: int, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float) -> None:
        losses.append(loss.item())
        if log is not None and len(losses) % log_every == 0:
            log(f"{desc} {len(losses)}{f'/{total}' if total is not None else ''} loss {losses[-1]:.4f}")

    model.train()
    run_steps(model, optimizer, scheduler, batches, loss_fn, itertools.count(), params=params, grad_clip=grad_clip,
              after_step=after_step, on_step=on_step)
    return losses
