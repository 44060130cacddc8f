"""Binding for Hugging Face transformers (>= 5.17): GPT-2, Llama, Qwen2, Mistral, Gemma, Gemma2, BERT, CLIP,
SigLIP, ViT and PaliGemma (its SigLIP and Gemma / Gemma2 attention).

Each attention module is converted in place (``module.__class__ = Diff<Class>``, a subclass of the family's own
class), so projection names (``q_proj`` …, ``query`` …, GPT-2's fused ``c_attn`` Conv1D) and the state dict of
the pretrained weights stay as they are, and peft's LoRA can target them. The subclass's ``forward`` re-does what
the family's forward does (projection, rotary embedding via the family's own ``apply_rotary_pos_emb``, KV-cache
update, attention, output projection) with the retrofit's second branch added:

- the second-branch keys (DiffK) or values (DiffV) go into the cache next to the first (concatenated along the head
  axis), so ``generate()`` with the cache equals ``generate()`` without it;
- masks: None (pure causal under sdpa), bool (True = attend, filled with ``finfo.min``) or additive float, sliced to
  the key length; ``is_causal`` and ``sliding_window`` are honoured when no mask is given;
- attention implementation: ``eager`` (and ``output_attentions``) run a path that mirrors transformers'
  ``eager_attention_forward`` and returns the maps; anything else runs ``F.scaled_dot_product_attention``;
- Gemma 2's logit softcap tanh(S/c)·c is applied to the logits before the softmax (eager path).
"""

from __future__ import annotations

import inspect
import sys

import torch.nn as nn

from .core import ADAPTER_ATTR, Candidate, register_binding
from .methods import INPUT_METHODS, RetrofitAdapter, eager_branch, run_method, sdpa_branch

__all__ = ["HF_ATTENTION_CLASSES"]  # DiffAttnCallback: built lazily by __getattr__ below

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


def _project(m: nn.Module, x, which: str | None = None):
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
    q2 = k2 = v2 = None
    which = INPUT_METHODS.get(ad.method)
    if which is not None:  # seed 001 App. D.2: X' = X W_d, then the pretrained projection
        t2 = heads(_project(self, ad.transform_input(x), which))
        q2, k2, v2 = (t2 if w == which else None for w in "qkv")
    elif ad.method == "daa":  # Q W_daa per head, before RoPE
        q2 = ad.transform_query(q)

    pos = a.get("position_embeddings")
    if pos is not None:
        cos, sin = pos
        rope = sys.modules[self._diffattn_base.__module__].apply_rotary_pos_emb
        hq, hk = q.shape[1], k.shape[1]
        qq = q if q2 is None else torch_cat(q, q2)
        kk = k if k2 is None else torch_cat(k, k2)
        qq, kk = rope(qq, kk, cos, sin)
        q, q2 = (qq, None) if q2 is None else (qq[:, :hq], qq[:, hq:])
        k, k2 = (kk, None) if k2 is None else (kk[:, :hk], kk[:, hk:])

    cache = a.get("past_key_values")
    if cache is not None:
        cache = getattr(cache, "self_attention_cache", cache)  # EncoderDecoderCache (GPT-2, BERT)
        hk = k.shape[1]
        kk = k if k2 is None else torch_cat(k, k2)  # (B, Hkv or 2·Hkv, N, d): any head layout caches
        vv = v if v2 is None else torch_cat(v, v2)
        if "cache_position" in a and pos is not None:
            kk, vv = cache.update(kk, vv, self.layer_idx, {"sin": pos[1], "cos": pos[0],
                                                          "cache_position": a["cache_position"]})
        else:
            kk, vv = cache.update(kk, vv, self.layer_idx)
        k, k2 = (kk, None) if k2 is None else (kk[:, :hk], kk[:, hk:])
        v, v2 = (vv, None) if v2 is None else (vv[:, :hk], vv[:, hk:])

    want_maps = bool(a.get("output_attentions", False))
    eager = getattr(self.config, "_attn_implementation", "eager") == "eager" or want_maps
    out, maps = run_method(
        ad, eager_branch if eager else sdpa_branch, q, k, v, q2=q2, k2=k2, v2=v2,
        scale=_scaling(self, d), need_weights=eager, mask=mask,
        dropout=_dropout(self) if self.training else 0.0, training=self.training,
        softcap=getattr(self, "attn_logit_softcapping", None),
        is_causal=bool(a.get("is_causal", getattr(self, "is_causal", False))),
        sliding_window=getattr(self, "sliding_window", None))
    out = out.transpose(1, 2).reshape(*x.shape[:-1], -1).contiguous()  # (B, N, h·d)
    for n in _OUT_NAMES:
        if hasattr(self, n):
            out = getattr(self, n)(out)
            break
    if hasattr(self, "resid_dropout"):
        out = self.resid_dropout(out)
    return out, maps


def torch_cat(a, b):
    import torch

    return torch.cat([a, b], dim=1)


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


class _HFBinding:
    families = [f"transformers {f}" for f in dict.fromkeys(HF_ATTENTION_CLASSES.values())] + [
        "transformers PaliGemma (SigLIP + Gemma/Gemma2)"]

    @staticmethod
    def _matches(m: nn.Module) -> bool:
        cls = type(m)
        if cls.__name__ not in HF_ATTENTION_CLASSES or not cls.__module__.startswith("transformers."):
            return False
        if getattr(m, "is_cross_attention", False):
            return False
        return _proj_names(m) is not None or hasattr(m, "c_attn")

    def find(self, model: nn.Module) -> list[Candidate]:
        out = []
        for name, m in model.named_modules():
            if self._matches(m):
                parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
                out.append(Candidate(name, m, parent, name.rsplit(".", 1)[-1], self))
        return out

    @staticmethod
    def dims(m: nn.Module) -> tuple[int, int, int]:
        d = _head_dim(m)
        names = _proj_names(m)
        if names is None:
            return int(m.embed_dim), int(m.num_heads), d
        q = getattr(m, names[0])
        return int(q.in_features), int(q.out_features) // d, d

    @staticmethod
    def convert(c: Candidate, adapter: RetrofitAdapter) -> nn.Module:
        m = c.module
        m.__class__ = _subclass(type(m))
        setattr(m, ADAPTER_ATTR, adapter)
        if not any(hasattr(m, n) for n in _OUT_NAMES):  # BERT / old ViT: output dense lives in the parent
            dense = getattr(getattr(c.parent, "output", None), "dense", None)
            if isinstance(dense, nn.Module):
                m.__dict__["_diffattn_out_proj"] = dense  # not registered: no duplicate in the state dict
        return m


register_binding(_HFBinding())


def _callback_class():
    from transformers import TrainerCallback

    from .core import step

    class DiffAttnCallback(TrainerCallback):
        """transformers ``Trainer`` callback: advances the retrofit schedule once per optimizer step
        (``on_step_end`` runs after each optimizer step, gradient accumulation included)."""

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if model is not None:
                step(model)
            return control

    return DiffAttnCallback


def __getattr__(name):
    if name == "DiffAttnCallback":
        cls = _callback_class()
        globals()["DiffAttnCallback"] = cls
        return cls
    raise AttributeError(name)
