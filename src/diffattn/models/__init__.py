"""Models: the CLIP / DiffCLIP family, ViT / DiffViT / DGViT, text encoders and causal LMs.

``create_model(name, **overrides)`` (``pretrained=TAG`` for the public checkpoints of ``list_pretrained()``),
``list_models()``, ``from_pretrained(dir_or_repo_id)``. Each family declares one
literal config table (``VIT_CONFIGS``, ``CLIP_CONFIGS``, ``TEXT_CONFIGS``, ``LM_CONFIGS``). Loaders of other
formats (DiffCLIP release, OpenAI/open_clip CLIP, timm ViT, DiffLlama) live in :mod:`diffattn.convert`; the ones
below are re-exported here for convenience.
"""

from .base import DiffattnModel, from_pretrained
from .causal_lm import LM_CONFIGS, CausalLM
from .clip import CLIP, CLIP_CONFIGS, TextTransformer, clip_loss, image_transform
from .pretrained import PRETRAINED, list_pretrained
from .registry import create_model, is_model, list_models, model_config, register_model
from .summary import ModelSummary, parameter_count, summary
from .text import TEXT_CONFIGS, TextClassifier, Vocabulary
from .vit import VIT_CONFIGS, VisionTransformer, register_timm

__all__ = ["DiffattnModel", "from_pretrained", "PRETRAINED", "list_pretrained",
           "create_model", "is_model", "list_models", "model_config",
           "register_model", "CausalLM", "TextClassifier", "Vocabulary", "CLIP", "TextTransformer", "clip_loss",
           "image_transform", "VisionTransformer", "ModelSummary", "parameter_count", "summary", "VIT_CONFIGS",
           "CLIP_CONFIGS", "TEXT_CONFIGS", "LM_CONFIGS", "load_diffclip", "load_open_clip", "load_openai_clip",
           "load_timm_vit", "read_checkpoint", "from_diffllama", "to_diffllama", "to_diffllama_state_dict",
           "register_timm"]

# Defined in diffattn.convert, which imports the model classes above; resolved on first use so that importing
# diffattn.models never needs diffattn.convert (no import cycle).
_FROM_CONVERT = ("load_diffclip", "load_open_clip", "load_openai_clip", "load_timm_vit", "read_checkpoint",
                 "from_diffllama", "to_diffllama", "to_diffllama_state_dict")


def __getattr__(name: str):
    if name in _FROM_CONVERT:
        from .. import convert

        return getattr(convert, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
