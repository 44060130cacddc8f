"""diffattn: differential attention for PyTorch.

Differential attention computes two softmax maps and subtracts one from the other, O = (A1 − λ A2) V, to cancel
attention noise (Ye et al. 2024). This package has every variant of the seed papers as drop-in layers with O(N)
memory backends and a fused Triton kernel, retrofits of pretrained Hugging Face, timm and open_clip models, and
models (DiffCLIP, DiffViT/DGViT, text classifiers, causal LMs). See README.md.

``import diffattn`` is light: it imports neither torch nor any optional library (transformers, timm, open_clip, …);
each name below is imported on first use (PEP 562), so ``diffattn --version`` answers at once. Importing a diffattn
module changes nothing outside it (no environment variable, logger or other library's registry): what diffattn adds
to another library happens in explicit calls. :func:`register_timm` puts diffattn's vision models in timm's registry
(``timm.create_model("diff_vit_nano")``); :func:`diffattn.retrofit` of a transformers model and the functions that
load transformers checkpoints install the filter that warns (:class:`~diffattn.adapters.RetrofitCheckpointWarning`)
when a retrofitted checkpoint is loaded into a plain model (:func:`diffattn.adapters.hf.install_load_warning`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and IDEs
    from . import (  # noqa: F401
        adapters,
        convert,
        data,
        export,
        factory,
        formats,
        functional,
        io,
        lambdas,
        layers,
        losses,
        models,
        openclip,
    )
    from .adapters import from_pretrained_retrofit, load_adapter, retrofit, save_adapter
    from .data import get_dataset, list_datasets
    from .export import export_onnx
    from .factory import create_model, from_pretrained, load_run, register_timm
    from .formats import FormatMigrationWarning
    from .functional import AttentionWeights, attention, diff_attention
    from .layers import (
        Attention,
        DiffAttention,
        DiffAttentionV2,
        GatedDiffAttention,
        KVCache,
        SwiGLU,
        attention_class,
    )
    from .models import list_models, list_pretrained
    from .openclip import create_model_and_transforms, create_model_from_pretrained, get_tokenizer

from ._version import __version__  # a literal in a leaf: `diffattn --version` reads it without importing torch

__all__ = [
    "functional",
    "lambdas",
    "layers",
    "convert",
    "models",
    "AttentionWeights",
    "attention",
    "diff_attention",
    "Attention",
    "DiffAttention",
    "GatedDiffAttention",
    "DiffAttentionV2",
    "KVCache",
    "SwiGLU",
    "attention_class",
    "retrofit",
    "save_adapter",
    "load_adapter",
    "from_pretrained_retrofit",
    "create_model",
    "list_models",
    "list_pretrained",
    "from_pretrained",
    "load_run",
    "export_onnx",
    "create_model_and_transforms",
    "create_model_from_pretrained",
    "get_tokenizer",
    "data",
    "get_dataset",
    "list_datasets",
    "FormatMigrationWarning",
    "register_timm",
    "__version__",
]

#: the library's subpackages, imported on first access (``diffattn.layers``) or by ``import diffattn.layers``
_SUBMODULES = ("adapters", "convert", "data", "export", "factory", "formats", "functional", "io", "lambdas", "layers",
               "losses", "models", "openclip")
#: public name -> the subpackage that defines it
_LAZY = {
    **dict.fromkeys(("AttentionWeights", "attention", "diff_attention"), "functional"),
    **dict.fromkeys(("Attention", "DiffAttention", "GatedDiffAttention", "DiffAttentionV2", "KVCache", "SwiGLU",
                     "attention_class"), "layers"),
    **dict.fromkeys(("retrofit", "save_adapter", "load_adapter", "from_pretrained_retrofit"), "adapters"),
    **dict.fromkeys(("create_model", "from_pretrained", "load_run", "register_timm"), "factory"),
    **dict.fromkeys(("list_models", "list_pretrained"), "models"),
    **dict.fromkeys(("create_model_and_transforms", "create_model_from_pretrained", "get_tokenizer"), "openclip"),
    "FormatMigrationWarning": "formats",
    "export_onnx": "export",
    **dict.fromkeys(("get_dataset", "list_datasets"), "data"),
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
