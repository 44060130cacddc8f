"""The λ(t) schedule of a retrofitted model: find its adapters and advance their step t once per optimizer step."""

from __future__ import annotations

import torch
import torch.nn as nn

from .methods import RetrofitAdapter

__all__ = ["adapters", "step", "attach_to_optimizer"]  # and DiffAttnCallback, built on first use


def adapters(model: nn.Module) -> list[tuple[str, RetrofitAdapter]]:
    """(name, adapter) for every :class:`RetrofitAdapter` in ``model``, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, RetrofitAdapter)]


def step(model: nn.Module, n: int = 1) -> int:
    """Advance every retrofitted layer's schedule by ``n`` optimizer steps (t ← t + n); returns the new t.

    ``n`` is a non-negative int; t is an int64 counter, so t + n must stay ≤ 2⁶³ − 1 (ValueError otherwise, with
    no layer advanced). λ(t) is constant from t = ``anneal_steps`` on.
    """
    ads = adapters(model)
    if not ads:
        raise ValueError("model has no retrofitted layers; call diffattn.retrofit(model, method) first")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int (optimizer steps), got {n!r}")
    for _, a in ads:  # check every layer before advancing any, so an error leaves the schedule as it was
        if n > a.max_advance():
            a.advance(n)  # raises the ValueError naming n and the limit
    for _, a in ads:
        a.advance(n)
    return int(ads[0][1].step_buffer)


def attach_to_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer):
    """Advance the schedule after every ``optimizer.step()``; returns the hook handle (``.remove()`` detaches)."""
    return optimizer.register_step_post_hook(lambda opt, args, kwargs: step(model))


def _callback_class():
    from transformers import TrainerCallback

    class DiffAttnCallback(TrainerCallback):
        """transformers ``Trainer`` callback: advances the retrofit schedule once per optimizer step
        (``on_step_end`` runs after each optimizer step, gradient accumulation included)."""

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if model is not None:
                step(model)
            return control

    return DiffAttnCallback


def __getattr__(name: str):
    if name == "DiffAttnCallback":  # built on first use: transformers is imported only then
        cls = _callback_class()
        globals()["DiffAttnCallback"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
