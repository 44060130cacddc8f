"""Layers: attention (standard, differential, gated), rotary embedding, KV cache, MLPs, norms."""

from .attention import ATTENTION_TYPES, Attention, DiffAttention, DiffAttentionV2, GatedDiffAttention, attention_class
from .kv_cache import KVCache
from .mlp import Mlp, SwiGLU
from .norm import RMSNorm, head_rms_norm
from .rope import ROPE_STYLES, RotaryEmbedding, apply_rotary

__all__ = [
    "ATTENTION_TYPES",
    "Attention",
    "DiffAttention",
    "DiffAttentionV2",
    "GatedDiffAttention",
    "attention_class",
    "KVCache",
    "Mlp",
    "SwiGLU",
    "RMSNorm",
    "head_rms_norm",
    "ROPE_STYLES",
    "RotaryEmbedding",
    "apply_rotary",
]
