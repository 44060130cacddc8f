"""Binding for Hugging Face transformers (>= 5.17): GPT-2, Llama, Qwen2, Mistral, Gemma, Gemma2, BERT, CLIP,
SigLIP, ViT and PaliGemma (its SigLIP and Gemma / Gemma2 attention).

Each attention module is converted in place (``module.__class__ = Diff<Class>``, a subclass of the family's own
class), so projection names (``q_proj`` …, ``query`` …, GPT-2's fused ``c_attn`` Conv1D) and the state dict of
the pretrained weights stay as they are, and peft's LoRA can target them. The subclass's ``forward`` re-does what
the family's forward does (projection, rotary embedding via the family's own ``apply_rotary_pos_emb``, KV-cache
update, attention, output projection) with the retrofit's second branch added:

- the second-branch keys (DiffK) or values (DiffV) go into the cache next to the first (concatenated along the
  channel axis, so every cache layer sees one head count: transformers' ``StaticCache`` allocates keys and values
  with the key's), so ``generate()`` with the dynamic or the static cache equals ``generate()`` without it;
- masks: None (pure causal under sdpa), bool (True = attend) or additive float (``finfo.min`` = blocked), sliced to
  the key length; ``is_causal`` and ``sliding_window`` are honoured when no mask is given;
- attention runs through :func:`diffattn.functional.diff_attention` / ``attention`` (backend ``auto``); the
  ``eager`` implementation and ``output_attentions`` ask the operator for the maps, as transformers' eager path
  returns them;
- Gemma 2's logit softcap tanh(S/c)·c goes to the operator's ``softcap``.
"""

from __future__ import annotations

import inspect
import sys

import torch
import torch.nn as nn

from ...ops import sliding_window_mask
from ..binding import ADAPTER_ATTR, BindingBase, Candidate, candidates
from ..methods import RetrofitAdapter, run_method, second_branch

__all__ = ["HF_ATTENTION_CLASSES", "TransformersBinding"]

#: class name → family, for the self-attention classes this binding converts
HF_ATTENTION_CLASSES = {
    "GPT2Attention": "GPT-2",
    "LlamaAttention": "Llama",
    "Qwen2Attention": "Qwen2",
    "MistralAttention": "Mistral",
    "GemmaAttention": "Gemma",
    "Gemma2Attention": "Gemma2",
    "BertSelfAttention": "BERT",
    "CLIPAttention": "CLIP",
    "SiglipAttention": "SigLIP",
    "ViTSelfAttention": "ViT",
    "ViTAttention": "ViT",
}

_PROJ_NAMES = (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"))
_OUT_NAMES = ("o_proj", "out_proj", "c_proj")


def _head_dim(m: nn.Module) -> int:
    d = getattr(m, "head_dim", None) or getattr(m, "attention_head_size", None)
    if d is None:
        raise ValueError(f"cannot find the head width of {type(m).__name__} (no head_dim / attention_head_size)")
    return int(d)


def _proj_names(m: nn.Module) -> tuple[str, str, str] | None:
    for names in _PROJ_NAMES:
        if all(hasattr(m, n) for n in names):
            return names
    return None


def _project(m: nn.Module, x: torch.Tensor, which: str | None = None):
    """(q, k, v), each (B, N, heads·d), or only one of them when ``which`` is "q", "k" or "v"."""
    names = _proj_names(m)
    if names is None:  # GPT-2: fused Conv1D c_attn, split into q | k | v
        qkv = m.c_attn(x).split(m.split_size, dim=2)
        return qkv if which is None else qkv["qkv".index(which)]
    if which is not None:
        return getattr(m, names["qkv".index(which)])(x)
    return tuple(getattr(m, n)(x) for n in names)


def _scaling(m: nn.Module, d: int) -> float:
    s = getattr(m, "scaling", None)
    if s is None:
        s = getattr(m, "scale", None)
    if s is None and hasattr(m, "scale_attn_weights"):  # GPT-2 before transformers precomputed it
        s = d**-0.5 if m.scale_attn_weights else 1.0
        if getattr(m, "scale_attn_by_inverse_layer_idx", False):
            s /= float(m.layer_idx + 1)
    return float(d**-0.5 if s is None else s)


def _dropout(m: nn.Module) -> float:
    for n in ("attention_dropout", "attn_dropout", "dropout"):
        v = getattr(m, n, None)
        if isinstance(v, nn.Dropout):
            return float(v.p)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return 0.0


def _cat(a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return a if b is None else torch.cat([a, b], dim=1)  # along the head axis


def _split(t: torch.Tensor, n: int, second: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    return (t[:, :n], t[:, n:]) if second else (t, None)


def _cat_channels(a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return a if b is None else torch.cat([a, b], dim=-1)  # (B, heads, N, 2d)


def _split_channels(t: torch.Tensor, n: int, second: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    return (t[..., :n], t[..., n:]) if second else (t, None)


#: the names the KV cache has had in the attention forward: ``cache`` from transformers 5.24 on,
#: ``past_key_values`` before (a deprecated alias until 5.40), ``past_key_value`` / ``layer_past`` earlier still
_CACHE_NAMES = ("cache", "past_key_values", "past_key_value", "layer_past")


def _find_cache(a: dict):
    """The KV cache among the forward's arguments, found by meaning: any of :data:`_CACHE_NAMES`, else any argument
    that is a transformers ``Cache``, so that a renamed argument never makes a retrofit decode without its cache."""
    for n in _CACHE_NAMES:
        if a.get(n) is not None:
            return a[n]
    from transformers.cache_utils import Cache

    return next((v for v in a.values() if isinstance(v, Cache)), None)


def _forward(self, *args, **kwargs):
    """Retrofitted forward: the family's projection / RoPE / cache steps plus the method's second branch."""
    bound = self._diffattn_sig.bind(self, *args, **kwargs)
    a = dict(bound.arguments)
    extra = dict(a.pop(self._diffattn_varkw, None) or {}) if self._diffattn_varkw else {}
    a.update(extra)
    x = a["hidden_states"]
    if a.get("encoder_hidden_states") is not None:
        raise NotImplementedError("retrofit converts self-attention only; got encoder_hidden_states")
    ad: RetrofitAdapter = getattr(self, ADAPTER_ATTR)
    mask = a.get("attention_mask")
    causal_mask = a.get("causal_attention_mask")  # CLIP text in older transformers
    if causal_mask is not None:
        mask = causal_mask if mask is None else mask + causal_mask
    d = _head_dim(self)
    shape = (*x.shape[:-1], -1, d)

    def heads(t):
        return t.view(shape).transpose(1, 2)  # (B, heads, N, d)

    q, k, v = (heads(t) for t in _project(self, x))
    q2, k2, v2 = second_branch(ad, x, q, lambda xx, which: heads(_project(self, xx, which)))

    pos = a.get("position_embeddings")
    if pos is not None:  # RoPE on both branches at once (DAA's W_daa acts before it)
        cos, sin = pos
        rope = sys.modules[self._diffattn_base.__module__].apply_rotary_pos_emb
        qq, kk = rope(_cat(q, q2), _cat(k, k2), cos, sin)
        q, q2 = _split(qq, q.shape[1], q2 is not None)
        k, k2 = _split(kk, k.shape[1], k2 is not None)

    cache = _find_cache(a)
    if cache is not None:
        cache = getattr(cache, "self_attention_cache", cache)  # EncoderDecoderCache (GPT-2, BERT)
        dk, dv = k.shape[-1], v.shape[-1]
        kk, vv = _cat_channels(k, k2), _cat_channels(v, v2)  # (B, Hkv, N, d or 2d): one head count for K and V
        kk, vv = cache.update(kk, vv, self.layer_idx)  # no cache layer of transformers >= 5.17 reads more
        k, k2 = _split_channels(kk, dk, k2 is not None)
        v, v2 = _split_channels(vv, dv, v2 is not None)

    nq, nk = q.shape[2], k.shape[2]
    is_causal = False
    if mask is not None:
        mask = mask[..., :nk]  # a static cache's mask can be longer than the keys
    elif nq > 1:
        window = getattr(self, "sliding_window", None)
        if window and nk > window:
            mask = sliding_window_mask(nq, nk, window, q.device)  # (Nq, Nk), causal inside the window
        else:
            is_causal = bool(a.get("is_causal", getattr(self, "is_causal", False)))
    eager = getattr(self.config, "_attn_implementation", "eager") == "eager"
    want_maps = bool(a.get("output_attentions", False)) or eager
    out, maps = run_method(
        ad, q, k, v, q2=q2, k2=k2, v2=v2, scale=_scaling(self, d), attn_mask=mask, is_causal=is_causal,
        dropout_p=_dropout(self) if self.training else 0.0, softcap=getattr(self, "attn_logit_softcapping", None),
        need_weights=want_maps, masked_rows="uniform" if eager else "zero")  # eager: softmax of equal logits
    out = out.transpose(1, 2).reshape(*x.shape[:-1], -1).contiguous()  # (B, N, h·d)
    for n in _OUT_NAMES:
        if hasattr(self, n):
            out = getattr(self, n)(out)
            break
    if hasattr(self, "resid_dropout"):
        out = self.resid_dropout(out)
    return out, maps


_SUBCLASSES: dict[type, type] = {}


def _subclass(cls: type) -> type:
    if cls not in _SUBCLASSES:
        sig = inspect.signature(cls.forward)
        varkw = next((p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None)
        _SUBCLASSES[cls] = type(f"Diff{cls.__name__}", (cls,), {
            "forward": _forward, "_diffattn_sig": sig, "_diffattn_varkw": varkw, "_diffattn_base": cls,
            "__module__": __name__, "__doc__": f"{cls.__name__} retrofitted with differential attention "
                                               f"(diffattn.adapters)."})
    return _SUBCLASSES[cls]


class TransformersBinding(BindingBase):
    """Converts the self-attention modules of :data:`HF_ATTENTION_CLASSES` (matched by class name and module)."""

    families = tuple(f"transformers {f}" for f in dict.fromkeys(HF_ATTENTION_CLASSES.values())) + (
        "transformers PaliGemma (SigLIP + Gemma/Gemma2)",)

    @staticmethod
    def _matches(m: nn.Module) -> bool:
        cls = type(m)
        if cls.__name__ not in HF_ATTENTION_CLASSES or not cls.__module__.startswith("transformers."):
            return False
        if getattr(m, "is_cross_attention", False):
            return False
        return _proj_names(m) is not None or hasattr(m, "c_attn")

    def find(self, model: nn.Module) -> list[Candidate]:
        return candidates(model, self, self._matches)

    def dims(self, m: nn.Module) -> tuple[int, int, int]:
        d = _head_dim(m)
        names = _proj_names(m)
        if names is None:
            return int(m.embed_dim), int(m.num_heads), d
        q = getattr(m, names[0])
        return int(q.in_features), int(q.out_features) // d, d

    def extra_trainable(self, c: Candidate) -> list[nn.Module]:
        """BERT / ViT: the attention's output projection lives in the parent (``<parent>.output.dense``)."""
        if any(hasattr(c.module, n) for n in _OUT_NAMES):
            return []
        dense = getattr(getattr(c.parent, "output", None), "dense", None)
        return [dense] if isinstance(dense, nn.Module) else []

    def retrofitted_class(self, module: nn.Module) -> type:
        return _subclass(type(module))
