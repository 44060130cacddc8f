"""The λ(t) schedule of a retrofitted model: find its adapters and advance their step t once per optimizer step."""

from __future__ import annotations

import torch
import torch.nn as nn

from .methods import RetrofitAdapter
from .naming import active_modules

__all__ = ["adapters", "step", "attach_to_optimizer", "lambda_logs"]  # and DiffAttnCallback, built on first use


def adapters(model: nn.Module) -> list[tuple[str, RetrofitAdapter]]:
    """(name, adapter) for every retrofitted layer of ``model``, in module order: one per layer.

    Under peft the name is the bare model's (``base_model.model.`` and the wrappers' segments removed) and the
    adapter is the one that runs (the trained copy when ``modules_to_save`` holds ``diff_adapter``)."""
    return [(canon, m) for canon, _, m in active_modules(model, RetrofitAdapter)]


def step(model: nn.Module, n: int = 1) -> int:
    """Advance every retrofitted layer's schedule by ``n`` optimizer steps (t ← t + n); returns the new t.

    ``n`` is a non-negative int; t is an int64 counter, so t + n must stay ≤ 2⁶³ − 1 (ValueError otherwise, with
    no layer advanced). λ(t) is constant from t = ``anneal_steps`` on.
    """
    ads = [(n, m) for n, m in model.named_modules() if isinstance(m, RetrofitAdapter)]  # peft copies included
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


def lambda_logs(model: nn.Module) -> dict[str, float]:
    """λ of every retrofitted layer as flat log entries (what :class:`DiffAttnCallback` adds to a Trainer's logs).

    ``diffattn/lambda_<i>``: λ of attention layer i (λ(t) of DAA (2025) eq. 3, or the re-parameterised λ of Ye et
    al. 2024 eq. 2); ``diffattn/lambda_mean``: their mean over layers; ``diffattn/anneal_step``: the schedule step
    t; ``diffattn/anneal_progress``: min(1, t/T), the annealing ramp (the blend β(t) of the Li et al. 2025 methods).
    """
    ads = adapters(model)
    if not ads:
        raise ValueError("model has no retrofitted layers; call diffattn.retrofit(model, method) first")
    out: dict[str, float] = {}
    with torch.no_grad():
        lams = [float(a.lambda_value()) for _, a in ads]
        for (_, a), lam in zip(ads, lams):
            out[f"diffattn/lambda_{a.layer_index}"] = lam
        a0 = ads[0][1]
        t = int(a0.step_buffer)
        out["diffattn/lambda_mean"] = sum(lams) / len(lams)
        out["diffattn/anneal_step"] = float(t)
        out["diffattn/anneal_progress"] = min(1.0, t / a0.anneal_steps)
    return out


def _report_to(args) -> list[str]:
    r = getattr(args, "report_to", None)
    r = [r] if isinstance(r, str) else list(r or [])
    return [x for x in r if x != "none"]


def _callback_class():
    from transformers import TrainerCallback

    class DiffAttnCallback(TrainerCallback):
        """transformers ``Trainer`` callback: advances the retrofit schedule once per optimizer step
        (``on_step_end`` runs after each optimizer step, gradient accumulation included) and adds λ to every log
        (:func:`lambda_logs`: ``diffattn/lambda_<i>``, ``diffattn/lambda_mean``, ``diffattn/anneal_step``,
        ``diffattn/anneal_progress``), in ``state.log_history`` too.

        The Trainer calls its ``report_to`` integrations (TensorBoard, W&B, …) before the callbacks passed to it,
        so attach the callback with :meth:`attach` (it goes first) for those to receive λ::

            trainer = Trainer(model=model, args=args, train_dataset=ds)
            DiffAttnCallback.attach(trainer)

        ``Trainer(..., callbacks=[DiffAttnCallback()])`` also advances the schedule and logs λ to the history and
        to the callbacks after it (and warns once when ``report_to`` names an integration).
        """

        def __init__(self, log_lambda: bool = True):
            if not isinstance(log_lambda, bool):
                raise TypeError(f"log_lambda must be a bool, got {type(log_lambda).__name__} {log_lambda!r}")
            self.log_lambda = log_lambda
            self.attached = False

        @classmethod
        def attach(cls, trainer, *, log_lambda: bool = True) -> DiffAttnCallback:
            """Put a new callback first in ``trainer``'s callbacks (replacing any DiffAttnCallback already there)
            and return it."""
            handler = getattr(trainer, "callback_handler", None)
            if handler is None or not isinstance(getattr(handler, "callbacks", None), list):
                raise TypeError(f"trainer must be a transformers Trainer, got {type(trainer).__name__}")
            handler.callbacks[:] = [c for c in handler.callbacks if not isinstance(c, cls)]
            cb = cls(log_lambda=log_lambda)
            cb.attached = True
            handler.callbacks.insert(0, cb)
            return cb

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if model is not None and not adapters(model):
                raise ValueError("DiffAttnCallback needs a retrofitted model; call diffattn.retrofit(model, method) "
                                 "before building the Trainer")
            if self.log_lambda and not self.attached and _report_to(args):
                import warnings

                warnings.warn(f"DiffAttnCallback passed in callbacks= runs after the report_to integrations "
                              f"{_report_to(args)}, which then never see λ; use DiffAttnCallback.attach(trainer)",
                              UserWarning, stacklevel=2)
            return control

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if model is not None:
                step(model)
            return control

        def on_log(self, args, state, control, logs=None, model=None, **kwargs):
            if not self.log_lambda or logs is None or model is None or not adapters(model):
                return control
            entries = lambda_logs(model)
            last = state.log_history[-1] if state.log_history else None
            if isinstance(last, dict) and all(last.get(k) == v for k, v in logs.items()):
                last.update(entries)  # the history entry the Trainer just wrote for these logs
            logs.update(entries)  # the same dict goes on to every later callback
            return control

    return DiffAttnCallback


def __getattr__(name: str):
    if name == "DiffAttnCallback":  # built on first use: transformers is imported only then
        cls = _callback_class()
        globals()["DiffAttnCallback"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
