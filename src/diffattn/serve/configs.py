"""transformers configuration classes for the ``config.json`` kinds vLLM reads through diffattn's plugin, registered
with ``AutoConfig`` (so no ``trust_remote_code``): ``model_type`` "diffattn" (diffattn's causal LMs) and "Motif" /
"motif" (the released Motif models). Each keeps every key of its file and adds the standard names vLLM reads
(``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``num_hidden_layers``,
``max_position_embeddings``) where the file spells them otherwise; those describe the attention as vLLM's cache holds
it (:class:`diffattn.serve.layout.ServedLayer`)."""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig

from ..formats import SERVE_MODEL_TYPE
from .checkpoints import reference_model
from .layout import ServedLayer

__all__ = ["DiffattnLMConfig", "MotifConfig", "register_configs"]


def _served_heads(config: PretrainedConfig, layout: str) -> None:
    """Set the standard head names from the reference model's first attention layer (no tensors: ``meta``)."""
    try:
        ref = reference_model(layout, config.to_dict())
    except (KeyError, TypeError, ValueError):
        return  # the model class says what is wrong when vLLM builds it
    served = ServedLayer.of(ref.blocks[0].attn)
    config.num_attention_heads = served.num_heads
    config.num_key_value_heads = served.groups
    config.head_dim = served.head_size


class DiffattnLMConfig(PretrainedConfig):
    """A diffattn causal LM's ``config.json`` (``model_type`` "diffattn", ``architectures`` ["DiffattnForCausalLM"]).
    diffattn's keys stay as saved (``dim``, ``depth``, ``num_heads``, ``attention``, …)."""

    model_type = SERVE_MODEL_TYPE

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if hasattr(self, "dim"):
            self.hidden_size = self.dim
            self.num_hidden_layers = self.depth
            self.max_position_embeddings = getattr(self, "max_seq_len", 2048)
            self.tie_word_embeddings = bool(getattr(self, "tie_embeddings", False))
            _served_heads(self, "diffattn")


class MotifConfig(PretrainedConfig):
    """A released Motif ``config.json`` (``model_type`` "Motif"), read without its remote code."""

    model_type = "Motif"

    def __init__(self, **kwargs):
        kwargs.setdefault("tie_word_embeddings", True)  # transformers' default, as the released code reads it
        super().__init__(**kwargs)


class MotifLowerConfig(MotifConfig):
    """The same with ``model_type`` "motif" (what diffattn's ``to_motif`` writes)."""

    model_type = "motif"


def register_configs() -> None:
    """Register the classes with transformers' ``AutoConfig`` (idempotent)."""
    for cls in (DiffattnLMConfig, MotifConfig, MotifLowerConfig):
        AutoConfig.register(cls.model_type, cls, exist_ok=True)
