"""Decoder-only language models with a switchable attention: Llama-style, standard / differential / gated / V2.

    ids (B, N) ─ tok_embed ─ blocks ─ norm ─ lm_head ─ logits (B, N, V)
    block:  x = x + attn(norm1(x));   x = x + mlp(norm2(x))        (pre-norm, RMSNorm, SwiGLU, RoPE "half")

One class, :class:`CausalLM`, serves the three families by its attention's kind: ``"standard"`` (a Llama),
``"diff"`` (the Diff Transformer, Ye et al. 2024 §2–3: differential attention, λ_init = 0.8 − 0.6·exp(−0.3·l)
with the 0-based layer index l, per-head RMSNorm) and ``"gated"`` (M-DGSA 2025, §4, in a decoder). All three keep
``num_heads`` = the standard head count h, so the differential model has h/2 heads of width 2d and the same
parameter count as the standard one plus 4d λ values and 2d norm weights per layer (Ye et al. 2024 §3.1 matches
sizes the same way). Everything outside ``blocks.*.attn`` is shared, so the switch changes only attention.

Incremental decoding: :meth:`CausalLM.new_kv_caches` gives one :class:`~diffattn.layers.KVCache` per layer (or,
with ``max_length``, one preallocated :class:`~diffattn.layers.StaticKVCache`); ``forward(ids, kv_caches=caches)``
appends to them. :meth:`CausalLM.generate` decodes greedily
(``temperature=0``) or by sampling (``temperature > 0``, optional ``top_k``), with or without the cache (same
tokens either way).

transformers' ``DiffLlama`` (halves layout, no sub-norm weight, ``rms_norm_eps`` everywhere, λ_init by layer
index) is exactly ``attention=dict(kind="diff", lambda_init="ye", sub_norm_affine=False, sub_norm_eps=norm_eps)``
(no q/k/v or output bias) with no MLP bias: :func:`diffattn.convert.to_diffllama` and
:func:`diffattn.convert.from_diffllama` convert exactly.

The kind ``"diff_v2"`` is the Diff Transformer V2 layer (Ye et al. 2026; :class:`~diffattn.layers.DiffAttentionV2`):
``num_heads`` = h differential heads of width d = dim / h, 2h query heads, one K and V per group shared by both
branches, λ = σ(x W_λ) per token and head, no sub-norm.

Tokenizer: ``model.set_tokenizer("gpt2")`` (GPT-2 BPE through tiktoken from the local ranks; or a ``tiktoken`` /
``transformers`` tokenizer, :mod:`diffattn.models.tokenizer`) attaches one; ``save_pretrained`` writes it beside the
weights, ``from_pretrained`` restores it, and ``model.generate_text(prompt)`` decodes a continuation.

Registered: the literal table :data:`LM_CONFIGS`: ``lm_{tiny,small,base}``, ``diff_lm_{tiny,small,base}``,
``dg_lm_{tiny,small,base}``, ``diff_v2_lm_{tiny,small,base}``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import KV_CACHES, AttentionSpec, KVCache, LooseAttention, RMSNorm, StaticKVCache, SwiGLU
from .base import DiffattnModel
from .config import check_args, is_int
from .registry import ModelFamily, register_family
from .tokenizer import LMTokenizer, as_lm_tokenizer, load_lm_tokenizer

__all__ = ["CausalLM", "LMBlock", "PreNormBlock", "llama_mlp_hidden", "LM_CONFIGS", "LLAMA_ATTENTION"]

#: the attention settings of a Llama block that differ from :class:`~diffattn.layers.AttentionSpec`'s defaults:
#: λ_init by depth (Ye et al. 2024) for the differential kinds, no q/k/v or output bias
LLAMA_ATTENTION = {"lambda_init": "ye", "qkv_bias": False, "out_bias": False}
_LM_FORCE = {"causal": True, "rope": "half"}  # what a decoder block fixes
_LM_DEFAULT = AttentionSpec("diff", **LLAMA_ATTENTION, **_LM_FORCE)
_LM_LOOSE = ("lambda_init", "lambda_form", "sub_norm", "num_kv_heads", "qkv_bias", "out_bias", "diff_norm_eps",
             "diff_norm_affine", "rope_theta", "backend")


def llama_mlp_hidden(dim: int, multiple_of: int = 64) -> int:
    """Llama's SwiGLU width: ⌈(2/3 · 4·dim) / multiple_of⌉ · multiple_of (Touvron et al. 2023; the
    Diff Transformer uses 8/3·d_model as well)."""
    hidden = int(2 * 4 * dim / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


class PreNormBlock(nn.Module):
    """x = x + attn(norm1(x)); x = x + mlp(norm2(x)): the forward of the pre-norm decoder blocks, whose subclasses
    build ``norm1``, ``attn``, ``norm2`` and ``mlp`` (:class:`LMBlock`, :class:`~diffattn.models.motif.MotifBlock`)."""

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, *,
                position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        """x: (B, N, D) → (B, N, D)."""
        x = x + self.attn(self.norm1(x), attn_mask, position_ids=position_ids, kv_cache=kv_cache)
        return x + self.mlp(self.norm2(x))


class LMBlock(PreNormBlock):
    """Pre-norm decoder block: x = x + attn(RMSNorm(x)); x = x + SwiGLU(RMSNorm(x)).

    ``depth`` is the block's 0-based index (for ``lambda_init="ye"``). ``attention`` is an
    :class:`~diffattn.layers.AttentionSpec` or its dict: every attention setting, the sub-norm of differential and
    gated layers included (``sub_norm_eps``, ``sub_norm_affine``; ``"diff_v2"`` has none, Diff Transformer V2
    drops it); the block is always causal with "half" rotary embedding. The loose keywords of before
    (:data:`LOOSE`) are deprecated (:class:`~diffattn.layers.LooseAttention`).
    """

    #: the spelling of before: ``attention="diff", lambda_init=…`` with a Llama's defaults (λ_init by depth, no
    #: biases), where ``drop`` was ``proj_drop`` too
    LOOSE = LooseAttention("LMBlock", _LM_LOOSE, kind="diff", defaults=LLAMA_ATTENTION, fill={"proj_drop": "drop"},
                           force=_LM_FORCE)

    def __init__(self, dim: int, num_heads: int, *, depth: int, attention: AttentionSpec | Mapping,
                 mlp_hidden: int, mlp_bias: bool = False, norm_eps: float = 1e-5, drop: float = 0.0, **loose):
        super().__init__()
        spec = self.LOOSE.resolve(attention, loose, {"drop": drop})
        self.norm1 = RMSNorm(dim, eps=norm_eps)
        self.attn = spec.build(dim, num_heads, depth)
        self.norm2 = RMSNorm(dim, eps=norm_eps)
        self.mlp = SwiGLU(dim, mlp_hidden, bias=mlp_bias, drop=drop)


class CausalLM(DiffattnModel):
    """Llama-style causal LM with attention of kind ``"standard" | "diff" | "gated" | "diff_v2"`` (module docstring).

    Args:
        vocab_size, dim, depth, num_heads: sizes; ``num_heads`` is the standard head count h (even for the
            differential layers), head width d = dim / h.
        mlp_hidden: SwiGLU width (default :func:`llama_mlp_hidden`).
        attention: an :class:`~diffattn.layers.AttentionSpec` or its dict, every attention setting: the kind,
            ``lambda_init`` (a float or ``"ye"``, 0-based layer index), ``num_kv_heads`` (grouped-query attention;
            default h), ``rope_theta``, the biases, the per-head sub-norm (``sub_norm``, ``sub_norm_eps``,
            ``sub_norm_affine``; DiffLlama: eps = ``rms_norm_eps``, no weight). The blocks are causal with "half"
            RoPE whatever it says. Default: :data:`LLAMA_ATTENTION` (differential, λ_init by depth, no biases). The
            loose keywords of before (:data:`LOOSE`) are deprecated (:class:`~diffattn.layers.LooseAttention`).
        tie_embeddings: share ``lm_head.weight`` with ``tok_embed.weight``.
        max_seq_len: recorded for exports (``max_position_embeddings``); RoPE itself has no limit.
    """

    #: vLLM serves every diffattn causal LM, whatever its attention kind, through diffattn's plugin (diffattn.serve)
    serve_architecture = "DiffattnForCausalLM"

    #: the spelling of before: ``attention="diff", lambda_init=…`` with a Llama's defaults, where ``drop_rate`` was
    #: ``proj_drop`` too
    LOOSE = LooseAttention("CausalLM", _LM_LOOSE, kind="diff", defaults=LLAMA_ATTENTION,
                           fill={"proj_drop": "drop_rate"}, force=_LM_FORCE)

    def __init__(self, vocab_size: int = 32000, dim: int = 512, depth: int = 8, num_heads: int = 8, *,
                 mlp_hidden: int | None = None,
                 attention: AttentionSpec | Mapping = _LM_DEFAULT,
                 max_seq_len: int = 2048, tie_embeddings: bool = False, norm_eps: float = 1e-5,
                 mlp_bias: bool = False, drop_rate: float = 0.0, **loose):
        super().__init__()
        check_args("CausalLM", vocab_size=vocab_size, dim=dim, depth=depth, num_heads=num_heads,
                   mlp_hidden=mlp_hidden, max_seq_len=max_seq_len, norm_eps=norm_eps, drop_rate=drop_rate)
        spec = self.LOOSE.resolve(attention, loose, {"drop_rate": drop_rate})
        self.vocab_size, self.dim, self.depth, self.attention = vocab_size, dim, depth, spec.kind
        self.attention_spec = spec
        self.max_seq_len, self.tie_embeddings = max_seq_len, tie_embeddings
        self.mlp_hidden = llama_mlp_hidden(dim) if mlp_hidden is None else mlp_hidden
        self.tok_embed = nn.Embedding(vocab_size, dim)
        self.drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList([
            LMBlock(dim, num_heads, depth=i, attention=spec, mlp_hidden=self.mlp_hidden, mlp_bias=mlp_bias,
                    norm_eps=norm_eps, drop=drop_rate)
            for i in range(depth)])
        self.norm = RMSNorm(dim, eps=norm_eps)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.init_weights()
        if tie_embeddings:
            self.lm_head.weight = self.tok_embed.weight
        self.tokenizer: LMTokenizer | None = None  # set_tokenizer; saved and loaded with the model

    # ------------------------------------------------------------------------------------------------ tokenizer

    def set_tokenizer(self, tokenizer) -> CausalLM:
        """Attach a tokenizer (``"gpt2"``, a ``tiktoken.Encoding`` or a ``transformers`` tokenizer;
        :func:`~diffattn.models.tokenizer.as_lm_tokenizer`); ``save_pretrained`` writes it beside the weights and
        ``from_pretrained`` of that folder restores it. Its vocabulary must fit the embedding (``vocab_size``)."""
        tok = as_lm_tokenizer(tokenizer)
        if tok.vocab_size > self.vocab_size:
            raise ValueError(f"tokenizer has {tok.vocab_size} tokens but the model's vocab_size is {self.vocab_size}; "
                             f"build the model with vocab_size >= {tok.vocab_size} (e.g. 50304 for GPT-2)")
        self.tokenizer = tok
        return self

    def _save_pretrained(self, save_directory) -> None:
        super()._save_pretrained(save_directory)  # model.safetensors (+ config.json by the hub mixin)
        if self.tokenizer is not None:
            self.tokenizer.save(save_directory)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, **kwargs):
        model = super()._from_pretrained(model_id=model_id, **kwargs)
        if os.path.isdir(model_id):
            tok = load_lm_tokenizer(model_id)
            if tok is not None:
                model.set_tokenizer(tok)
        return model

    @torch.no_grad()
    def generate_text(self, prompt: str, max_new_tokens: int = 32, **generate_kwargs) -> str:
        """``prompt`` continued by :meth:`generate` (greedy unless ``temperature`` > 0), decoded: the new text only.
        Stops at the tokenizer's end-of-text token unless ``eos_token_id`` is given."""
        if self.tokenizer is None:
            raise ValueError("generate_text needs a tokenizer: model.set_tokenizer('gpt2') (or a tiktoken / "
                             "transformers tokenizer) first")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"prompt must be a non-empty string, got {prompt!r:.80}")
        ids = self.tokenizer.encode(prompt)
        device = self.tok_embed.weight.device
        generate_kwargs.setdefault("eos_token_id", self.tokenizer.eot_token_id)
        out = self.generate(torch.tensor([ids], device=device), max_new_tokens, **generate_kwargs)[0, len(ids):]
        new = out.tolist()
        eos = generate_kwargs["eos_token_id"]
        if eos is not None and eos in new:
            new = new[:new.index(eos)]
        return self.tokenizer.decode(new)

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Llama init: N(0, std²) for embeddings and linear weights, zero biases; λ vectors and norms keep theirs."""
        if self.tok_embed.weight.device.type == "meta":
            return
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def new_kv_caches(self, max_length: int | None = None) -> list[KVCache] | list[StaticKVCache]:
        """One empty cache per block: a :class:`~diffattn.layers.KVCache` that grows with each step, or with
        ``max_length`` a :class:`~diffattn.layers.StaticKVCache` of that many positions (no copy of the past per
        step; fixed buffer shapes for ``torch.compile``)."""
        if max_length is None:
            return [KVCache() for _ in self.blocks]
        return [StaticKVCache(max_length) for _ in self.blocks]

    def _masks(self, input_ids, attention_mask, kv_caches, position_ids):
        B, N = input_ids.shape
        past = kv_caches[0].length if kv_caches is not None else 0
        attn_mask = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape != (B, past + N):
                raise ValueError(f"attention_mask must have shape (B, past + N) = {(B, past + N)} (1 = token, "
                                 f"0 = padding), got {tuple(attention_mask.shape)}")
            attn_mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, past + N)
        if position_ids is None:
            position_ids = torch.arange(past, past + N, device=input_ids.device)  # (N,)
        return attn_mask, position_ids

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                kv_caches: list[KVCache] | None = None, *, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """ids (B, N) → logits (B, N, vocab_size).

        attention_mask: (B, past + N), 1 for tokens and 0 for padding, over the cached and the new positions.
        kv_caches: from :meth:`new_kv_caches`; the new keys and values are appended (incremental decoding).
        position_ids: (N,) or (B, N) RoPE positions; default past, …, past + N − 1.
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
            got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be an integer tensor of shape (B, N), got {got}")
        if kv_caches is not None and len(kv_caches) != len(self.blocks):
            raise ValueError(f"kv_caches must hold one KVCache per block ({len(self.blocks)}), got {len(kv_caches)}")
        attn_mask, position_ids = self._masks(input_ids, attention_mask, kv_caches, position_ids)
        x = self.drop(self.tok_embed(input_ids))  # (B, N, D)
        for i, blk in enumerate(self.blocks):
            x = blk(x, attn_mask, position_ids=position_ids, kv_cache=None if kv_caches is None else kv_caches[i])
        return self.lm_head(self.norm(x))  # (B, N, V)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
                 top_k: int | None = None, attention_mask: torch.Tensor | None = None, use_cache: bool = True,
                 eos_token_id: int | None = None, generator: torch.Generator | None = None,
                 cache: str = "static") -> torch.Tensor:
        """Append ``max_new_tokens`` tokens to ``input_ids`` (B, N); returns (B, N + new).

        ``temperature=0``: greedy (argmax). ``temperature > 0``: sample from softmax(logits / T), restricted to
        the ``top_k`` largest logits when given. ``attention_mask`` (B, N) marks left padding (0); positions then
        count real tokens only. Rows that emitted ``eos_token_id`` keep emitting it; decoding stops when all did.
        With ``use_cache=False`` every step recomputes the whole prefix (same tokens, slower).
        ``cache``: ``"static"`` (default) preallocates the keys and values of N + ``max_new_tokens`` positions
        (:class:`~diffattn.layers.StaticKVCache`), so a step costs the same whatever was generated before;
        ``"dynamic"`` grows them by concatenation (:class:`~diffattn.layers.KVCache`), copying the past at every
        step. Both give the same tokens.
        """
        if cache not in KV_CACHES:
            raise ValueError(f"cache must be one of {tuple(KV_CACHES)}, got {cache!r}")
        if not is_int(max_new_tokens) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
        if top_k is not None and (not is_int(top_k) or top_k < 1):
            raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
        ids = input_ids
        mask = attention_mask.long() if attention_mask is not None else None
        caches = None
        if use_cache:
            caches = self.new_kv_caches(max(1, ids.shape[1] + max_new_tokens) if cache == "static" else None)
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        new = ids
        for _ in range(max_new_tokens):
            pos = None
            if mask is not None:
                pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, N_total): real-token positions
                pos = pos[:, -new.shape[1]:] if use_cache else pos
            logits = self(new if use_cache else ids, mask, caches, position_ids=pos)[:, -1].float()  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(dim=-1)
            else:
                logits = logits / temperature
                if top_k is not None and top_k < logits.shape[-1]:
                    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)
            if eos_token_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
                done |= nxt == eos_token_id
            new = nxt[:, None]  # (B, 1)
            ids = torch.cat([ids, new], dim=1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(new)], dim=1)
            if eos_token_id is not None and bool(done.all()):
                break
        return ids


# --------------------------------------------------------------------------------------------- registry

# tiny is a CPU size (GQA with 2 key/value heads); small and base are GPT-2-small-like widths. M-DGSA's λ_init is
# fixed at 0.8 (M-DGSA 2025, App. B.5: best for M-DGSA, the spec's default); the differential models use the depth
# schedule "ye" (LLAMA_ATTENTION).
_TINY, _SMALL, _BASE = (dict(vocab_size=512, dim=64, depth=2, num_heads=4, max_seq_len=256),
                        dict(vocab_size=32000, dim=512, depth=8, num_heads=8, max_seq_len=1024),
                        dict(vocab_size=50304, dim=768, depth=12, num_heads=12, max_seq_len=2048))
_GQA = dict(num_kv_heads=2)  # tiny's grouped-query attention
LM_CONFIGS: dict[str, dict] = {
    "lm_tiny": dict(_TINY, attention=dict(kind="standard", **LLAMA_ATTENTION, **_GQA)),
    "lm_small": dict(_SMALL, attention=dict(kind="standard", **LLAMA_ATTENTION)),
    "lm_base": dict(_BASE, attention=dict(kind="standard", **LLAMA_ATTENTION)),
    "diff_lm_tiny": dict(_TINY, attention=dict(kind="diff", **LLAMA_ATTENTION, **_GQA)),
    "diff_lm_small": dict(_SMALL, attention=dict(kind="diff", **LLAMA_ATTENTION)),
    "diff_lm_base": dict(_BASE, attention=dict(kind="diff", **LLAMA_ATTENTION)),
    "dg_lm_tiny": dict(_TINY, attention=dict(kind="gated", qkv_bias=False, out_bias=False, **_GQA)),
    "dg_lm_small": dict(_SMALL, attention=dict(kind="gated", qkv_bias=False, out_bias=False)),
    "dg_lm_base": dict(_BASE, attention=dict(kind="gated", qkv_bias=False, out_bias=False)),
    # Diff Transformer V2: 2h query heads, one K and V shared by both branches, per-token σ(λ), no sub-norm
    "diff_v2_lm_tiny": dict(_TINY, attention=dict(kind="diff_v2", **LLAMA_ATTENTION, **_GQA)),
    "diff_v2_lm_small": dict(_SMALL, attention=dict(kind="diff_v2", **LLAMA_ATTENTION)),
    "diff_v2_lm_base": dict(_BASE, attention=dict(kind="diff_v2", **LLAMA_ATTENTION)),
}

register_family(ModelFamily(CausalLM, LM_CONFIGS, __name__, "Llama-style causal LM."))
