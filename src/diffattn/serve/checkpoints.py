"""The checkpoints a server reads, as diffattn models: their ``config.json`` → a diffattn model on the ``meta`` device
(its structure, no tensors), and their tensor names → diffattn's. Plain PyTorch, no vLLM.

Three layouts:

- ``"diffattn"``: a folder written by diffattn's ``save_pretrained`` (or ``diffattn train``): a
  :class:`~diffattn.models.CausalLM` or :class:`~diffattn.models.motif.MotifLM` of any attention kind; names as saved.
- ``"diffllama"``: transformers' ``DiffLlamaForCausalLM``; q/k/v heads in the halves layout, permuted into diffattn's
  adjacent one (:func:`diffattn.convert.diffllama.halves_to_adjacent_perm`).
- ``"motif"``: the released Motif checkpoints (Motif-2.6B, Motif-2-12.7B), read as :mod:`diffattn.convert.motif`
  reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.nn as nn

from ..convert.diffllama import halves_to_adjacent_perm, permute_heads
from ..convert.motif import motif_kwargs, motif_name_map
from ..formats import FORMAT, FORMAT_KEY
from ..layers import AttentionSpec
from ..models.base import model_class
from ..models.causal_lm import CausalLM
from ..models.motif import MotifLM

__all__ = ["LAYOUTS", "reference_model", "to_diffattn_names"]

LAYOUTS = ("diffattn", "diffllama", "motif")


def reference_model(layout: str, config: Mapping[str, Any]) -> nn.Module:
    """The diffattn model (on ``meta``) that a checkpoint of ``layout`` with ``config`` (its ``config.json`` as a
    dict, extra keys allowed) holds."""
    with torch.device("meta"):
        if layout == "diffattn":
            arch = config.get("architecture")
            cls = model_class(arch) if isinstance(arch, str) else None
            if cls is None or not issubclass(cls, CausalLM):
                raise ValueError(f"config.json names architecture {arch!r}; vLLM serves diffattn's causal LMs "
                                 f"(CausalLM, MotifLM)")
            if config.get(FORMAT_KEY, 0) != FORMAT:
                raise ValueError(f"config.json is diffattn format {config.get(FORMAT_KEY, 0)}, served: format "
                                 f"{FORMAT}; load the folder with diffattn.from_pretrained and save it again")
            kwargs = {k: config[k] for k in cls._hub_mixin_init_parameters if k in config and k != "loose"}
            return cls(**cls.upgrade_config(kwargs))
        if layout == "diffllama":
            return _diffllama_model(config)
        if layout == "motif":
            return MotifLM(**motif_kwargs(dict(config)))
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _diffllama_model(c: Mapping[str, Any]) -> nn.Module:
    """The :class:`CausalLM` of a ``DiffLlamaConfig`` dict, as :func:`diffattn.convert.from_diffllama` builds it."""
    if c.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.hidden_act must be 'silu' (SwiGLU), got {c['hidden_act']!r}")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"config rope_parameters {rope!r}: only plain RoPE is served")
    theta = float(rope.get("rope_theta", c.get("rope_theta", 10000.0)))
    h, dim = int(c["num_attention_heads"]), int(c["hidden_size"])
    if c.get("head_dim") not in (None, dim // h):
        raise ValueError(f"config.head_dim={c['head_dim']} must be hidden_size / num_attention_heads = {dim // h}")
    eps, bias = float(c["rms_norm_eps"]), bool(c.get("attention_bias", False))
    attention = AttentionSpec("diff", lambda_init="ye", num_kv_heads=int(c.get("num_key_value_heads") or h),
                              rope_theta=theta, sub_norm_eps=eps, sub_norm_affine=False, qkv_bias=bias,
                              out_bias=bias, causal=True, rope="half")
    return CausalLM(int(c["vocab_size"]), dim, int(c["num_hidden_layers"]), h, mlp_hidden=int(c["intermediate_size"]),
                    attention=attention, max_seq_len=int(c.get("max_position_embeddings", 2048)),
                    tie_embeddings=bool(c.get("tie_word_embeddings", False)), norm_eps=eps)


def to_diffattn_names(layout: str, ref: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """(diffattn name, tensor) for each (checkpoint name, tensor) of ``weights``, in diffattn's head layout; rotary
    ``inv_freq`` buffers are dropped; an unknown name is a ValueError naming it."""
    if layout == "diffattn":
        yield from weights
        return
    if layout == "motif":
        names = motif_name_map(len(ref.blocks))
        for name, t in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            if name not in names:
                raise ValueError(f"the Motif checkpoint holds {name!r}, which a Motif model has no place for")
            yield names[name], t
        return
    if layout == "diffllama":
        yield from _diffllama_names(ref, weights)
        return
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


_DIFFLLAMA_TOP = {"model.embed_tokens.weight": "tok_embed.weight", "model.norm.weight": "norm.weight",
                  "lm_head.weight": "lm_head.weight"}
_DIFFLLAMA_LAYER = {"self_attn.o_proj": "attn.out_proj", "input_layernorm": "norm1",
                    "post_attention_layernorm": "norm2", "mlp.gate_proj": "mlp.gate_proj",
                    "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj"}


def _diffllama_names(ref: nn.Module, weights):
    attn = ref.blocks[0].attn
    d, h, hkv = attn.head_dim, attn.num_heads, attn.num_kv_heads
    perms = {"q_proj": halves_to_adjacent_perm(h), "k_proj": halves_to_adjacent_perm(hkv),
             "v_proj": halves_to_adjacent_perm(hkv)}
    for name, t in weights:
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name in _DIFFLLAMA_TOP:
            yield _DIFFLLAMA_TOP[name], t
            continue
        parts = name.split(".")
        if len(parts) < 5 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
            raise ValueError(f"the DiffLlama checkpoint holds {name!r}, which DiffLlama has no place for")
        i, rest = parts[2], ".".join(parts[3:])
        module, _, leaf = rest.rpartition(".")
        if module in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            proj = module.split(".")[1]
            yield f"blocks.{i}.attn.{proj}.{leaf}", permute_heads(t, perms[proj], d)
        elif module in _DIFFLLAMA_LAYER:
            yield f"blocks.{i}.{_DIFFLLAMA_LAYER[module]}.{leaf}", t
        elif module == "self_attn" and leaf in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            yield f"blocks.{i}.attn.{leaf}", t
        else:
            raise ValueError(f"the DiffLlama checkpoint holds {name!r}, which DiffLlama has no place for")
