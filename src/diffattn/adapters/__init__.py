"""Retrofit: turn the attention of pretrained transformers, timm and open_clip models into differential attention.

Methods (docs/retrofit.md): DAA, DEX, DiffQ, DiffK, DiffV (DAA (2025), annealed λ(t) of eq. 3; DEX after Kong et al.
2025) and shared-QK, split-heads (Li et al. 2025, re-parameterised λ, per-head RMSNorm × (1 − λ_init)).

    import diffattn
    model = diffattn.retrofit(model, "daa", lambda_init=0.8, anneal_steps=1000)
    # or: diffattn.retrofit(model, diffattn.adapters.RetrofitConfig("daa", anneal_steps=1000))
    ...  # train; call diffattn.adapters.step(model) once per optimizer step
    diffattn.save_adapter(model, "out/")
    model = diffattn.load_adapter(fresh_base_model, "out/")
    # a transformers model: model.save_pretrained("ckpt/"); diffattn.from_pretrained_retrofit("ckpt/")

Layout: :mod:`.methods` (one module per method, the registry, :class:`RetrofitAdapter`), :mod:`.binding` (the
:class:`Binding` protocol),
:mod:`.bindings` (transformers, timm, open_clip, and the ``BINDINGS`` list), :mod:`.config`
(:class:`RetrofitConfig`), :mod:`.core` (``retrofit`` and reports), :mod:`.schedule` (``step``), :mod:`.saving`.
"""

from ..deprecations import moved_attribute
from . import schedule
from .binding import Binding, Candidate
from .config import TRAIN_MODES, RetrofitConfig
from .core import count_parameters, lambda_summary, plan_retrofit, retrofit, retrofit_config, supported_families
from .hf import RetrofitCheckpointWarning, from_pretrained_retrofit
from .methods import (
    ANNEALED_METHODS,
    BLENDED_METHODS,
    METHODS,
    RetrofitAdapter,
    RetrofitMethod,
    branch_maps,
    build_method,
    list_methods,
    register_method,
)
from .saving import load_adapter, read_adapter, save_adapter
from .schedule import adapters, attach_to_optimizer, lambda_logs, step

__all__ = [
    "METHODS",
    "ANNEALED_METHODS",
    "BLENDED_METHODS",
    "RetrofitMethod",
    "register_method",
    "build_method",
    "list_methods",
    "TRAIN_MODES",
    "Binding",
    "Candidate",
    "RetrofitAdapter",
    "RetrofitConfig",
    "retrofit",
    "retrofit_config",
    "plan_retrofit",
    "step",
    "lambda_logs",
    "attach_to_optimizer",
    "count_parameters",
    "lambda_summary",
    "save_adapter",
    "load_adapter",
    "read_adapter",
    "adapters",
    "supported_families",
    "DiffAttnCallback",
    "from_pretrained_retrofit",
    "RetrofitCheckpointWarning",
    "branch_maps",
]

# install_load_warning() runs in the calls that retrofit or load a transformers model (adapters.hf): not at import


#: the method groups under their old names (rows of :data:`diffattn.deprecations.DEPRECATIONS`)
_deprecated = moved_attribute(__name__, {"SEED001_METHODS": lambda: ANNEALED_METHODS,
                                         "SEED002_METHODS": lambda: BLENDED_METHODS})


def __getattr__(name: str):
    if name == "DiffAttnCallback":  # needs transformers: built on first use
        return schedule.DiffAttnCallback
    return _deprecated(name)  # the deprecated names, else AttributeError
