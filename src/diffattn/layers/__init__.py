"""Layers: attention (standard, differential, gated, grouped differential), rotary embedding, KV cache, MLPs,
norms, and the shared building blocks (the attention spec, the pre-norm block)."""

from ..deprecations import moved_attribute
from .attention import Attention, DiffAttention, DiffAttentionV2, DiffConfig, GatedDiffAttention
from .blocks import Block, DropPath, LooseAttention, PatchEmbed
from .grouped import GroupedDiffAttention
from .kv_cache import KV_CACHES, KVCache, StaticKVCache
from .loading import load_layer
from .mlp import MLP_TYPES, Mlp, QuickGELU, SwiGLU, build_mlp
from .norm import RMSNorm, head_rms_norm
from .polynorm import Motif3PolyNormGLU, PolyNorm, PolyNormGLU
from .rope import ROPE_STYLES, RotaryEmbedding, YarnRotaryEmbedding, apply_rotary
from .spec import ATTENTION_TYPES, HEAD_LAYOUTS, AttentionSpec, attention_class, attention_kind, register_attention
from .stable_audio import StableAudioAttention

# isort: split
from .gdla import GroupedLatentDiffAttention  # registered last: ATTENTION_TYPES keeps the order of the kinds above

__all__ = [
    "ATTENTION_TYPES",
    "AttentionSpec",
    "DiffConfig",
    "HEAD_LAYOUTS",
    "register_attention",
    "LooseAttention",
    "Attention",
    "DiffAttention",
    "DiffAttentionV2",
    "GatedDiffAttention",
    "GroupedDiffAttention",
    "GroupedLatentDiffAttention",
    "StableAudioAttention",
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
    "Motif3PolyNormGLU",
    "MLP_TYPES",
    "build_mlp",
    "Block",
    "DropPath",
    "PatchEmbed",
    "RMSNorm",
    "head_rms_norm",
    "ROPE_STYLES",
    "RotaryEmbedding",
    "YarnRotaryEmbedding",
    "apply_rotary",
]


def _kind_settings() -> dict[str, tuple[str, ...]]:
    """What ``KIND_SETTINGS`` held: each setting only some kinds take, with those kinds."""
    every = set(AttentionSpec.settings_of("standard"))
    out: dict[str, list[str]] = {}
    for kind in ATTENTION_TYPES:
        for name in AttentionSpec.settings_of(kind):
            if name not in every:
                out.setdefault(name, []).append(kind)
    return {name: tuple(kinds) for name, kinds in out.items()}


__getattr__ = moved_attribute(__name__, {"KIND_SETTINGS": _kind_settings})
