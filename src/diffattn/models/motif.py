"""The Motif decoders as a :class:`~diffattn.models.CausalLM`: Motif-2.6B (Motif Technologies 2025, arXiv 2508.09148:
Diff Transformer attention, Ye et al. 2024, in a Llama-style decoder) and Motif-2-12.7B (Motif Technologies 2025,
arXiv 2511.07464: grouped differential attention, arXiv 2510.06949).

    block:  x = x + attn(RMSNorm(x));   x = x + down(PolyNorm(gate(x)) ⊙ up(x))   (pre-norm, RoPE "half")

What differs from :class:`CausalLM`: the MLP (:class:`~diffattn.layers.PolyNormGLU`), the attention of Motif-2-12.7B
(:class:`~diffattn.layers.GroupedDiffAttention` with ``num_noise_heads`` < ``num_heads / 2`` and its own
``head_dim``), the sub-norm's eps (``attn_norm_eps``, Motif's ``attn_rms_norm_eps``) and λ_init = 0.8 −
0.6·exp(−0.3·(l − 1)) (``lambda_init="motif"``: the released schedule, layer 0 ≈ −0.0099). Everything else
(forward, KV caches, ``generate``, save/load) is :class:`CausalLM`'s. With ``num_noise_heads`` = ``num_heads / 2``
and ``head_dim`` = dim / num_heads the layers are :class:`~diffattn.layers.DiffAttention` (Motif-2.6B).

:mod:`diffattn.convert.motif` reads and writes the released checkpoints (``from_motif``, ``to_motif``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn as nn

from ..layers import AttentionSpec, LooseAttention, PolyNormGLU, RMSNorm
from .base import DiffattnModel
from .causal_lm import CausalLM, PreNormBlock
from .config import check_args

__all__ = ["MotifLM", "MotifBlock", "MOTIF_ATTENTION"]

#: the attention settings of Motif's decoders that differ from :class:`~diffattn.layers.AttentionSpec`'s defaults:
#: the released λ_init schedule (``lambda_init="motif"``) and no q/k/v or output bias (Motif-2.6B's config)
MOTIF_ATTENTION = {"lambda_init": "motif", "qkv_bias": False, "out_bias": False}
_MOTIF_FORCE = {"causal": True, "rope": "half"}  # what a decoder fixes
_MOTIF_DEFAULT = AttentionSpec("diff", **MOTIF_ATTENTION, **_MOTIF_FORCE)


class _MotifLoose(LooseAttention):
    """The released config's attention keys, which :class:`MotifLM` took as arguments before it took a spec:
    ``num_noise_heads`` and ``head_dim`` make the kind ``"grouped"`` unless they are those of differential attention
    (half the heads, dim / num_heads), which they are then dropped for."""

    def convert(self, attention: str | Mapping | AttentionSpec | None, loose: Mapping[str, Any],
                args: Mapping[str, Any], *, warn: bool = True) -> AttentionSpec:
        loose = dict(loose)
        h, dim = args["num_heads"], args["dim"]
        noise, width = loose.pop("num_noise_heads", None), loose.pop("head_dim", None)
        if not ((noise is None or 2 * noise == h) and (width is None or width * h == dim)):
            attention = "grouped" if attention is None else attention
            loose.update({k: v for k, v in (("num_noise_heads", noise), ("head_dim", width)) if v is not None})
        return super().convert(attention, loose, args, warn=warn)


class MotifBlock(PreNormBlock):
    """x = x + attn(norm1(x)); x = x + mlp(norm2(x)): :class:`~diffattn.models.causal_lm.LMBlock` with the
    PolyNorm MLP and any differential attention layer (same state-dict names)."""

    def __init__(self, dim: int, attn: nn.Module, mlp_hidden: int, *, norm_eps: float, mlp_bias: bool,
                 poly_norm_eps: float, drop: float = 0.0):
        super().__init__()
        self.norm1 = RMSNorm(dim, eps=norm_eps)
        self.attn = attn
        self.norm2 = RMSNorm(dim, eps=norm_eps)
        self.mlp = PolyNormGLU(dim, mlp_hidden, bias=mlp_bias, eps=poly_norm_eps, drop=drop)


class MotifLM(CausalLM):
    """A Motif decoder (module docstring).

    Args:
        vocab_size, dim, depth: sizes (``vocab_size``, ``hidden_size``, ``num_hidden_layers``).
        num_heads: query heads of width ``head_dim``, signal and noise together (``num_attention_heads``).
        num_noise_heads: noise heads (``num_noise_heads``); default num_heads / 2 (differential attention).
        num_kv_heads: key/value heads (``num_key_value_heads``, even); default num_heads.
        head_dim: default dim / num_heads.
        mlp_hidden: ``intermediate_size``.
        attention: an :class:`~diffattn.layers.AttentionSpec` or its dict: kind ``"diff"`` (Motif-2.6B) or
            ``"grouped"`` with ``num_noise_heads`` and ``head_dim`` (Motif-2-12.7B); λ_init ``"motif"`` (the
            released schedule), ``num_kv_heads`` (``num_key_value_heads``), ``sub_norm_eps``
            (``attn_rms_norm_eps``), ``rope_theta``, the q/k/v and o_proj biases. Always causal with RoPE "half".
            Default: Motif-2.6B's, :data:`MOTIF_ATTENTION` (``{**MOTIF_ATTENTION, "lambda_init": "ye"}`` changes
            one setting). :func:`diffattn.convert.motif_kwargs` gives a released config's.
        norm_eps: ``rms_norm_eps`` of the block and final norms; poly_norm_eps: the eps of PolyNorm (1e-6 in the
            released code).
        mlp_bias: the MLP's biases.

    The released config's attention keys as arguments (``lambda_init=``, ``num_noise_heads=``, ``attn_norm_eps=``,
    …, the spelling before the spec) still build the same model until diffattn 0.3.0, with a FutureWarning
    (:class:`~diffattn.layers.LooseAttention`); saved ``config.json`` files that hold them load as they did.
    """

    #: the spelling of before: the released config's attention keys as arguments; ``drop_rate`` was ``proj_drop``
    LOOSE = _MotifLoose("MotifLM", ("lambda_init", "num_kv_heads", "qkv_bias", "out_bias", "rope_theta", "backend",
                                    "attn_norm_eps", "num_noise_heads", "head_dim"), kind="diff",
                        defaults=MOTIF_ATTENTION, fill={"proj_drop": "drop_rate"}, force=_MOTIF_FORCE)

    def __init__(self, vocab_size: int = 32000, dim: int = 512, depth: int = 8, num_heads: int = 8, *,
                 attention: AttentionSpec | Mapping = _MOTIF_DEFAULT, mlp_hidden: int = 1536, max_seq_len: int = 2048,
                 tie_embeddings: bool = False, norm_eps: float = 1e-6, poly_norm_eps: float = 1e-6,
                 mlp_bias: bool = False, drop_rate: float = 0.0, **loose):
        DiffattnModel.__init__(self)  # not CausalLM's: its blocks are SwiGLU blocks
        check_args("MotifLM", vocab_size=vocab_size, dim=dim, depth=depth, num_heads=num_heads,
                   mlp_hidden=mlp_hidden, max_seq_len=max_seq_len, norm_eps=norm_eps, drop_rate=drop_rate)
        spec = self.LOOSE.resolve(attention, loose, {"drop_rate": drop_rate, "num_heads": num_heads, "dim": dim})
        self.vocab_size, self.dim, self.depth, self.attention = vocab_size, dim, depth, spec.kind
        self.attention_spec = spec
        self.max_seq_len, self.tie_embeddings, self.mlp_hidden = max_seq_len, tie_embeddings, mlp_hidden
        self.tok_embed = nn.Embedding(vocab_size, dim)
        self.drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList([  # every layer through the one spelling of attention, the spec
            MotifBlock(dim, self.attention_spec.build(dim, num_heads, depth=i), mlp_hidden, norm_eps=norm_eps,
                       mlp_bias=mlp_bias, poly_norm_eps=poly_norm_eps, drop=drop_rate) for i in range(depth)])
        self.num_noise_heads = getattr(self.blocks[0].attn, "num_noise_heads", 0)  # H_n (half the heads: diff)
        self.norm = RMSNorm(dim, eps=norm_eps)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.init_weights()
        if tie_embeddings:
            self.lm_head.weight = self.tok_embed.weight
        self.tokenizer = None
