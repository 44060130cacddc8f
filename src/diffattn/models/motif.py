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

import torch
import torch.nn as nn

from ..layers import AttentionSpec, KVCache, PolyNormGLU, RMSNorm
from .base import DiffattnModel
from .causal_lm import CausalLM
from .config import check_args

__all__ = ["MotifLM", "MotifBlock"]


class MotifBlock(nn.Module):
    """x = x + attn(norm1(x)); x = x + mlp(norm2(x)): :class:`~diffattn.models.causal_lm.LMBlock` with the
    PolyNorm MLP and any differential attention layer (same state-dict names)."""

    def __init__(self, dim: int, attn: nn.Module, mlp_hidden: int, *, norm_eps: float, mlp_bias: bool,
                 poly_norm_eps: float, drop: float = 0.0):
        super().__init__()
        self.norm1 = RMSNorm(dim, eps=norm_eps)
        self.attn = attn
        self.norm2 = RMSNorm(dim, eps=norm_eps)
        self.mlp = PolyNormGLU(dim, mlp_hidden, bias=mlp_bias, eps=poly_norm_eps, drop=drop)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, *,
                position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), attn_mask, position_ids=position_ids, kv_cache=kv_cache)
        return x + self.mlp(self.norm2(x))


class MotifLM(CausalLM):
    """A Motif decoder (module docstring).

    Args:
        vocab_size, dim, depth: sizes (``vocab_size``, ``hidden_size``, ``num_hidden_layers``).
        num_heads: query heads of width ``head_dim``, signal and noise together (``num_attention_heads``).
        num_noise_heads: noise heads (``num_noise_heads``); default num_heads / 2 (differential attention).
        num_kv_heads: key/value heads (``num_key_value_heads``, even); default num_heads.
        head_dim: default dim / num_heads.
        mlp_hidden: ``intermediate_size``.
        lambda_init: ``"motif"`` (the released schedule), ``"ye"`` or a float.
        norm_eps: ``rms_norm_eps`` of the block and final norms; attn_norm_eps: ``attn_rms_norm_eps`` of the
            attention sub-norm; poly_norm_eps: the eps of PolyNorm (1e-6 in the released code).
        qkv_bias, out_bias, mlp_bias: biases of q/k/v, o_proj and the MLP.

    Its arguments are the released config's, not an ``attention`` spec: the spec is derived from them
    (``attention_spec``: kind ``"diff"``, or ``"grouped"`` with ``num_noise_heads`` and ``head_dim``) and builds
    every layer (:meth:`AttentionSpec.build`); saved files keep the arguments flat, so it has no loose-keyword
    conversion.
    """

    LOOSE = None

    def __init__(self, vocab_size: int = 32000, dim: int = 512, depth: int = 8, num_heads: int = 8, *,
                 num_noise_heads: int | None = None, num_kv_heads: int | None = None, head_dim: int | None = None,
                 mlp_hidden: int = 1536, lambda_init: float | str = "motif", rope_theta: float = 10000.0,
                 max_seq_len: int = 2048, tie_embeddings: bool = False, norm_eps: float = 1e-6,
                 attn_norm_eps: float = 1e-5, poly_norm_eps: float = 1e-6, qkv_bias: bool = False,
                 out_bias: bool = False, mlp_bias: bool = False, drop_rate: float = 0.0, backend: str = "auto"):
        DiffattnModel.__init__(self)  # not CausalLM's: its blocks are SwiGLU blocks
        check_args("MotifLM", vocab_size=vocab_size, dim=dim, depth=depth, num_heads=num_heads,
                   num_kv_heads=num_kv_heads, mlp_hidden=mlp_hidden, max_seq_len=max_seq_len, norm_eps=norm_eps,
                   diff_norm_eps=attn_norm_eps, rope_theta=rope_theta, drop_rate=drop_rate)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        plain = (num_noise_heads is None or 2 * num_noise_heads == num_heads) and \
            (head_dim is None or head_dim * num_heads == dim)
        kind = "diff" if plain else "grouped"
        self.vocab_size, self.dim, self.depth, self.attention = vocab_size, dim, depth, kind
        grouped = dict(num_noise_heads=num_noise_heads, head_dim=head_dim) if kind == "grouped" else {}
        self.attention_spec = AttentionSpec(kind, lambda_init=lambda_init, num_kv_heads=num_kv_heads,
                                            qkv_bias=qkv_bias, out_bias=out_bias, sub_norm_eps=attn_norm_eps,
                                            causal=True, rope="half", rope_theta=rope_theta, backend=backend,
                                            proj_drop=drop_rate, **grouped)
        self.num_noise_heads = num_heads // 2 if num_noise_heads is None else num_noise_heads
        self.max_seq_len, self.tie_embeddings, self.mlp_hidden = max_seq_len, tie_embeddings, mlp_hidden
        self.tok_embed = nn.Embedding(vocab_size, dim)
        self.drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList([  # every layer through the one spelling of attention, the spec
            MotifBlock(dim, self.attention_spec.build(dim, num_heads, depth=i), mlp_hidden, norm_eps=norm_eps,
                       mlp_bias=mlp_bias, poly_norm_eps=poly_norm_eps, drop=drop_rate) for i in range(depth)])
        self.norm = RMSNorm(dim, eps=norm_eps)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.init_weights()
        if tie_embeddings:
            self.lm_head.weight = self.tok_embed.weight
        self.tokenizer = None
