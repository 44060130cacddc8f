"""Models: the CLIP / DiffCLIP family, ViT / DiffViT / DGViT, text encoders and causal LMs.

``create_model(name, **overrides)``, ``list_models()``, ``from_pretrained(dir_or_repo_id)``.
"""

from .base import DiffattnModel, from_pretrained
from .registry import create_model, is_model, list_models, register_model

__all__ = ["DiffattnModel", "from_pretrained", "create_model", "is_model", "list_models", "register_model"]

from .causal_lm import CausalLM, from_diffllama, to_diffllama, to_diffllama_state_dict  # noqa: E402
from .text import TextClassifier, Vocabulary  # noqa: E402

__all__ += ["CausalLM", "from_diffllama", "to_diffllama", "to_diffllama_state_dict", "TextClassifier",
            "Vocabulary"]

from .clip import CLIP, TextTransformer, clip_loss, image_transform  # noqa: E402
from .convert import (  # noqa: E402
    load_diffclip,
    load_open_clip,
    load_openai_clip,
    load_timm_vit,
    read_checkpoint,
)
from .summary import ModelSummary, parameter_count, summary  # noqa: E402
from .vit import VisionTransformer  # noqa: E402  (importing it registers the vision models with timm)

__all__ += ["CLIP", "TextTransformer", "clip_loss", "image_transform", "load_diffclip", "load_open_clip",
            "load_openai_clip", "load_timm_vit", "read_checkpoint", "ModelSummary", "parameter_count",
            "summary", "VisionTransformer"]
