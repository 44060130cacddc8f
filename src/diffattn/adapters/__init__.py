"""Retrofit: turn the attention of pretrained transformers, timm and open_clip models into differential attention.

Methods (DESIGN.md §3.4): DAA, DEX, DiffQ, DiffK, DiffV (seed 001, annealed λ(t) of eq. 3) and shared-QK,
split-heads (seed 002, re-parameterised λ, per-head RMSNorm × (1 − λ_init)).

    import diffattn
    model = diffattn.retrofit(model, "daa", lambda_init=0.8, anneal_steps=1000)
    ...  # train; call diffattn.adapters.step(model) once per optimizer step
    diffattn.save_adapter(model, "out/")
    model = diffattn.load_adapter(fresh_base_model, "out/")
"""

from .core import (
    adapters,
    attach_to_optimizer,
    count_parameters,
    lambda_summary,
    load_adapter,
    retrofit,
    save_adapter,
    step,
    supported_families,
)
from .methods import METHODS, SEED001_METHODS, SEED002_METHODS, RetrofitAdapter

__all__ = [
    "METHODS",
    "SEED001_METHODS",
    "SEED002_METHODS",
    "RetrofitAdapter",
    "retrofit",
    "step",
    "attach_to_optimizer",
    "count_parameters",
    "lambda_summary",
    "save_adapter",
    "load_adapter",
    "adapters",
    "supported_families",
    "DiffAttnCallback",
]


def __getattr__(name):
    if name == "DiffAttnCallback":
        from .hf import DiffAttnCallback

        return DiffAttnCallback
    raise AttributeError(f"module 'diffattn.adapters' has no attribute {name!r}")
