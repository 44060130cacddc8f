"""Models: the CLIP / DiffCLIP family, ViT / DiffViT / DGViT, text encoders and causal LMs.

``create_model(name, **overrides)`` (``pretrained=TAG`` for the public checkpoints of ``list_pretrained()``),
``list_models()``, ``from_pretrained(dir_or_repo_id)``. Each family declares one
literal config table (``VIT_CONFIGS``, ``CLIP_CONFIGS``, ``TEXT_CONFIGS``, ``LM_CONFIGS``). Loaders of other
formats (DiffCLIP release, OpenAI/open_clip CLIP, timm ViT, DiffLlama) live in :mod:`diffattn.convert`; the ones
below are re-exported here for convenience.

Importing this package imports every family module, so that each registers itself with the registry (which
imports none of them). ``create_model``, ``from_pretrained`` and ``register_timm`` are :mod:`diffattn.factory`'s
and the loaders :mod:`diffattn.convert`'s: both sit above this package, so they are re-exported lazily (PEP 562)
and no module of this package imports them.
"""

from . import motif, vlm  # noqa: F401  (vlm registers the VLM family; motif defines MotifLM for from_pretrained)
from .base import DiffattnModel
from .causal_lm import LM_CONFIGS, CausalLM
from .clip import CLIP, CLIP_CONFIGS, TextTransformer, clip_loss, image_transform
from .pretrained import PRETRAINED, list_pretrained
from .registry import is_model, list_models, model_config, register_model
from .summary import ModelSummary, parameter_count, summary
from .text import TEXT_CONFIGS, TextClassifier, Vocabulary
from .vit import VIT_CONFIGS, VisionTransformer

__all__ = ["DiffattnModel", "from_pretrained", "PRETRAINED", "list_pretrained",
           "create_model", "is_model", "list_models", "model_config",
           "register_model", "CausalLM", "TextClassifier", "Vocabulary", "CLIP", "TextTransformer", "clip_loss",
           "image_transform", "VisionTransformer", "ModelSummary", "parameter_count", "summary", "VIT_CONFIGS",
           "CLIP_CONFIGS", "TEXT_CONFIGS", "LM_CONFIGS", "load_diffclip", "load_open_clip", "load_openai_clip",
           "load_timm_vit", "read_checkpoint", "from_diffllama", "to_diffllama", "to_diffllama_state_dict",
           "register_timm"]

#: name -> the module above this package that defines it, imported on first use
_LAZY = {
    **dict.fromkeys(("create_model", "from_pretrained", "register_timm"), "diffattn.factory"),
    **dict.fromkeys(("load_diffclip", "load_open_clip", "load_openai_clip", "load_timm_vit", "read_checkpoint",
                     "from_diffllama", "to_diffllama", "to_diffllama_state_dict"), "diffattn.convert"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
