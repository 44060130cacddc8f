"""Layers: attention (standard, differential, gated, grouped differential), rotary embedding, KV cache, MLPs,
norms, and the shared building blocks (the attention spec, the pre-norm block)."""

from .attention import (
    ATTENTION_TYPES,
    Attention,
    DiffAttention,
    DiffAttentionV2,
    GatedDiffAttention,
    attention_class,
    attention_kind,
)
from .blocks import KIND_SETTINGS, AttentionSpec, Block, DropPath, LooseAttention, PatchEmbed
from .grouped import GroupedDiffAttention
from .kv_cache import KV_CACHES, KVCache, StaticKVCache
from .loading import load_layer
from .mlp import MLP_TYPES, Mlp, QuickGELU, SwiGLU, build_mlp
from .norm import RMSNorm, head_rms_norm
from .polynorm import PolyNorm, PolyNormGLU
from .rope import ROPE_STYLES, RotaryEmbedding, apply_rotary

__all__ = [
    "ATTENTION_TYPES",
    "AttentionSpec",
    "KIND_SETTINGS",
    "LooseAttention",
    "Attention",
    "DiffAttention",
    "DiffAttentionV2",
    "GatedDiffAttention",
    "GroupedDiffAttention",
    "attention_class",
    "attention_kind",
    "load_layer",
    "KVCache",
    "StaticKVCache",
    "KV_CACHES",
    "Mlp",
    "SwiGLU",
    "QuickGELU",
    "PolyNorm",
    "PolyNormGLU",
    "MLP_TYPES",
    "build_mlp",
    "Block",
    "DropPath",
    "PatchEmbed",
    "RMSNorm",
    "head_rms_norm",
    "ROPE_STYLES",
    "RotaryEmbedding",
    "apply_rotary",
]
