"""Loaders for the checkpoints users already have: the DiffCLIP release, OpenAI/open_clip CLIP, timm ViTs.

Files are read with ``torch.load(weights_only=True)`` (plus ``argparse.Namespace``, which SLIP-style
checkpoints store under ``args``) or safetensors, never as arbitrary pickles. Each loader infers the
architecture from the tensors' shapes, builds the registered model with those sizes, renames the keys and
loads with ``strict=True``: the result computes the same function as the source model.

- DiffCLIP release (``hammh0a/DiffCLIP_ViTB16_CC3M`` / ``_CC12M``, ``checkpoint_best.pt``; SLIP keys
  ``module.visual.blocks.i.attn.q_proj``, ``module.transformer.resblocks.i.attn.lambda_q1``, ``diff_norm``,
  ``ln_1``, ``mlp.c_fc``, ``image_projection``) → :func:`load_diffclip` → ``diffclip_vit_b16``.
- OpenAI CLIP (``visual.conv1``, ``visual.class_embedding``, ``attn.in_proj_weight``, ``visual.proj``)
  → :func:`load_openai_clip` → ``clip_vit_b16`` with QuickGELU.
- open_clip ``ViT-B-16`` (the same keys) → :func:`load_open_clip` → ``clip_vit_b16`` with GELU.
- timm ``vit_*`` (``patch_embed.proj``, ``blocks.i.attn.qkv``, ``attn.proj``) → :func:`load_timm_vit`
  → ``vit_*``.

Head counts are not stored in weights: differential towers reveal them through the width d of ``lambda_q1``
(h = width / d); otherwise the default is width / 64 (the rule of OpenAI CLIP, open_clip and timm ViTs) and
``vision_num_heads`` / ``text_num_heads`` / ``num_heads`` override it. Neither is λ_init: pass
``lambda_init="ye"`` for a DiffCLIP* checkpoint.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Mapping

import torch
import torch.nn as nn

from .clip import CLIP
from .registry import create_model
from .vit import VisionTransformer

__all__ = [
    "read_checkpoint",
    "convert_diffclip_state_dict",
    "convert_openai_clip_state_dict",
    "convert_timm_vit_state_dict",
    "load_diffclip",
    "load_openai_clip",
    "load_open_clip",
    "load_timm_vit",
]

StateDict = Mapping[str, torch.Tensor]


def read_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of a ``.safetensors`` file or of a ``.pt``/``.pth``/``.bin`` read with ``weights_only=True``.

    A SLIP-style dict (``{"state_dict": ..., "args": Namespace, "epoch": ...}``) gives its ``state_dict``; a
    ``{"model": ...}`` dict its ``model``; a DataParallel ``module.`` prefix is removed.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"path must be an existing checkpoint file, got {path!r}")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        obj = load_file(path)
    else:
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    return _tensors(obj, f"checkpoint {path!r}")


def _tensors(obj, what: str) -> dict[str, torch.Tensor]:
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model"):
            if key in obj and isinstance(obj[key], Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{what} must hold a state dict (name → tensor), got {type(obj).__name__}")
    sd = dict(obj)
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def _source(src, what: str) -> dict[str, torch.Tensor]:
    if isinstance(src, (str, os.PathLike)):
        return read_checkpoint(src)
    return _tensors(src, what)


# ------------------------------------------------------------------------------------------- key mapping

_OPENAI_BLOCK = {"ln_1": "norm1", "ln_2": "norm2", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}


def _map_block(rest: str, value: torch.Tensor, out: dict, prefix: str) -> None:
    """One block's key (after ``resblocks.i.``) in OpenAI/SLIP/DiffCLIP naming → ours."""
    if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):  # nn.MultiheadAttention: rows [q; k; v]
        q, k, v = value.chunk(3, dim=0)
        kind = rest.rsplit("_", 1)[1]
        for name, t in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            out[f"{prefix}attn.{name}.{kind}"] = t
        return
    for old, new in _OPENAI_BLOCK.items():
        if rest.startswith(old + "."):
            out[prefix + new + rest[len(old):]] = value
            return
    out[prefix + rest] = value  # attn.q_proj / out_proj / diff_norm / lambda_* keep their names


def _unknown(keys, what: str) -> None:
    if keys:
        raise ValueError(f"{what} has keys diffattn cannot map: {sorted(keys)[:10]}"
                         + (f" (+{len(keys) - 10} more)" if len(keys) > 10 else ""))


def convert_diffclip_state_dict(state_dict: StateDict) -> dict[str, torch.Tensor]:
    """DiffCLIP release keys (SLIP lineage; ``module.`` already removed) → :class:`CLIP` keys.

    ``visual.*`` is a timm ViT whose attention has seed 003's names: kept as is. The text tower
    (``token_embedding``, ``positional_embedding``, ``transformer.resblocks.i.{ln_1, attn, ln_2, mlp.c_fc,
    mlp.c_proj}``, ``ln_final``) goes under ``text.``; a standard text tower's ``attn.in_proj_*`` (DiffCLIP†,
    SLIP's CLIP) is split into q/k/v. ``image_projection``, ``text_projection``, ``logit_scale`` keep their
    names.
    """
    out, bad = {}, []
    for key, v in state_dict.items():
        if key.startswith("visual."):
            if key.startswith(("visual.head.", "visual.fc_norm.")) or "ls1" in key or "ls2" in key:
                bad.append(key)
            else:
                out[key] = v
        elif key == "token_embedding.weight":
            out["text.token_embedding.weight"] = v
        elif key == "positional_embedding":
            out["text.pos_embed"] = v
        elif key.startswith("ln_final."):
            out["text.norm." + key.split(".", 1)[1]] = v
        elif m := re.match(r"transformer\.resblocks\.(\d+)\.(.+)$", key):
            _map_block(m.group(2), v, out, f"text.blocks.{m.group(1)}.")
        elif key in ("image_projection", "text_projection", "logit_scale"):
            out[key] = v
        else:
            bad.append(key)
    _unknown(bad, "the DiffCLIP state dict")
    return out


def convert_openai_clip_state_dict(state_dict: StateDict) -> dict[str, torch.Tensor]:
    """OpenAI CLIP / open_clip ViT keys → :class:`CLIP` keys.

    ``visual.conv1`` → ``visual.patch_embed.proj``; ``visual.class_embedding`` (D,) → ``visual.cls_token``
    (1, 1, D); ``visual.positional_embedding`` (N, D) → ``visual.pos_embed`` (1, N, D); ``ln_pre`` →
    ``norm_pre``; ``ln_post`` → ``norm``; ``visual.proj`` → ``image_projection``; blocks as
    :func:`convert_diffclip_state_dict`. The JIT archive's ``input_resolution``, ``context_length``,
    ``vocab_size`` and ``attn_mask`` buffers are dropped.
    """
    out, bad = {}, []
    simple = {"visual.conv1.weight": "visual.patch_embed.proj.weight", "visual.proj": "image_projection",
              "token_embedding.weight": "text.token_embedding.weight",
              "positional_embedding": "text.pos_embed",
              "text_projection": "text_projection", "logit_scale": "logit_scale"}
    for key, v in state_dict.items():
        if key in ("input_resolution", "context_length", "vocab_size") or key.endswith("attn_mask"):
            continue
        if key in simple:
            out[simple[key]] = v
        elif key == "visual.class_embedding":
            out["visual.cls_token"] = v.reshape(1, 1, -1)
        elif key == "visual.positional_embedding":
            out["visual.pos_embed"] = v.unsqueeze(0)
        elif m := re.match(r"visual\.(ln_pre|ln_post)\.(weight|bias)$", key):
            out[f"visual.{'norm_pre' if m.group(1) == 'ln_pre' else 'norm'}.{m.group(2)}"] = v
        elif key.startswith("ln_final."):
            out["text.norm." + key.split(".", 1)[1]] = v
        elif m := re.match(r"(visual\.)?transformer\.resblocks\.(\d+)\.(.+)$", key):
            tower = "visual" if m.group(1) else "text"
            _map_block(m.group(3), v, out, f"{tower}.blocks.{m.group(2)}.")
        else:
            bad.append(key)
    _unknown(bad, "the OpenAI/open_clip state dict")
    return out


def convert_timm_vit_state_dict(state_dict: StateDict) -> dict[str, torch.Tensor]:
    """timm ``VisionTransformer`` keys → :class:`VisionTransformer` keys: ``attn.qkv`` (rows [q; k; v]) is
    split into ``q_proj``/``k_proj``/``v_proj`` and ``attn.proj`` becomes ``out_proj``; the rest keeps its
    name.
    Layer scale, q/k norms, register tokens and ``fc_norm`` are not supported (ValueError)."""
    out, bad = {}, []
    for key, v in state_dict.items():
        if m := re.match(r"blocks\.(\d+)\.attn\.(qkv|proj)\.(weight|bias)$", key):
            prefix = f"blocks.{m.group(1)}.attn."
            if m.group(2) == "qkv":
                for name, t in zip(("q_proj", "k_proj", "v_proj"), v.chunk(3, dim=0)):
                    out[f"{prefix}{name}.{m.group(3)}"] = t
            else:
                out[f"{prefix}out_proj.{m.group(3)}"] = v
        elif re.match(r"(cls_token|pos_embed|patch_embed\.proj\.|norm_pre\.|norm\.|head\.|"
                      r"blocks\.\d+\.(norm1|norm2|mlp\.fc1|mlp\.fc2)\.)", key):
            out[key] = v
        else:
            bad.append(key)
    _unknown(bad, "the timm ViT state dict")
    return out


# ------------------------------------------------------------------------------------ shape inference


def _depth(sd: StateDict, prefix: str) -> int:
    idx = {int(m.group(1)) for k in sd if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    if not idx:
        raise ValueError(f"the state dict has no blocks under {prefix!r}")
    return max(idx) + 1


def _heads(sd: StateDict, prefix: str, width: int) -> tuple[str, int]:
    """(attention, num_heads) of the blocks under ``prefix`` (converted keys)."""
    lam = sd.get(f"{prefix}0.attn.lambda_q1")
    if lam is not None:
        return "diff", width // lam.numel()
    return "standard", max(width // 64, 1)


def _vision_args(sd: StateDict, prefix: str) -> dict:
    w = sd[f"{prefix}patch_embed.proj.weight"]  # (D, C, p, p)
    d, p = w.shape[0], w.shape[-1]
    n = sd[f"{prefix}pos_embed"].shape[1] - (1 if f"{prefix}cls_token" in sd else 0)
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"pos_embed must hold a square grid of patches (+ CLS), got {n} patch positions")
    attention, heads = _heads(sd, f"{prefix}blocks.", d)
    return dict(img_size=side * p, patch_size=p, in_chans=w.shape[1], embed_dim=d,
                depth=_depth(sd, f"{prefix}blocks."), num_heads=heads, attention=attention,
                mlp_ratio=sd[f"{prefix}blocks.0.mlp.fc1.weight"].shape[0] / d,
                patch_bias=f"{prefix}patch_embed.proj.bias" in sd, pre_norm=f"{prefix}norm_pre.weight" in sd)


def _text_args(sd: StateDict) -> dict:
    vocab, d = sd["text.token_embedding.weight"].shape
    attention, heads = _heads(sd, "text.blocks.", d)
    return dict(vocab_size=vocab, context_length=sd["text.pos_embed"].shape[0], embed_dim=d,
                depth=_depth(sd, "text.blocks."), num_heads=heads, attention=attention,
                mlp_ratio=sd["text.blocks.0.mlp.fc1.weight"].shape[0] / d)


def _load_exact(model: nn.Module, sd: dict, what: str) -> nn.Module:
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"{what} does not match the model: missing {missing[:8]}, "
                         f"unexpected {unexpected[:8]}")
    return model


def _clip_from(sd: dict, name: str, fixed: dict, overrides: dict, what: str) -> CLIP:
    args = {"embed_dim": sd["image_projection"].shape[1]}
    args.update({f"vision_{k}": v for k, v in _vision_args(sd, "visual.").items()})
    args.update({f"text_{k}": v for k, v in _text_args(sd).items()})
    args.update(fixed)
    args.update(overrides)
    return _load_exact(create_model(name, **args), sd, what)


# ---------------------------------------------------------------------------------------------- loaders


def load_diffclip(src, name: str = "diffclip_vit_b16", **overrides) -> CLIP:
    """The DiffCLIP release (a SLIP-style ``checkpoint_best.pt`` path, its dict or its ``state_dict``) as
    ``name`` (default ``diffclip_vit_b16``). Architecture as the DiffCLIP code: vision LayerNorm eps 1e-5,
    GELU; text QuickGELU; sizes and per-tower attention inferred (a DiffCLIP† checkpoint loads too)."""
    sd = convert_diffclip_state_dict(_source(src, "the DiffCLIP checkpoint"))
    fixed = dict(vision_norm_eps=1e-5, vision_mlp="gelu", text_mlp="quick_gelu", text_norm_eps=1e-5)
    return _clip_from(sd, name, fixed, overrides, "the DiffCLIP checkpoint")


def load_openai_clip(src, name: str = "clip_vit_b16", **overrides) -> CLIP:
    """OpenAI CLIP ViT weights (state dict, path, or an OpenAI/open_clip model object) as ``name``:
    QuickGELU in both towers, ``ln_pre``, bias-free patch convolution, LayerNorm eps 1e-5."""
    return _load_openai_format(src, name, "quick_gelu", overrides)


def load_open_clip(src, name: str = "clip_vit_b16", *, quick_gelu: bool | None = None, **overrides) -> CLIP:
    """open_clip ViT weights (``ViT-B-16`` and friends; a model object, state dict or path) as ``name``.
    open_clip uses GELU unless the config ends in ``-quickgelu``; a model object tells it, a state dict needs
    ``quick_gelu=True`` for those. Head counts are read from a model object."""
    if quick_gelu is None:
        quick_gelu = _uses_quick_gelu(src) if isinstance(src, nn.Module) else False
    return _load_openai_format(src, name, "quick_gelu" if quick_gelu else "gelu", overrides)


def _uses_quick_gelu(model: nn.Module) -> bool:
    return any(type(m).__name__ == "QuickGELU" for m in model.modules())


def _load_openai_format(src, name: str, act: str, overrides: dict) -> CLIP:
    if isinstance(src, nn.Module):  # open_clip / OpenAI model objects know their head counts
        for tower, mod in (("vision", getattr(src, "visual", None)), ("text", src)):
            blocks = getattr(getattr(mod, "transformer", None), "resblocks", None)
            if blocks is not None and isinstance(getattr(blocks[0], "attn", None), nn.MultiheadAttention):
                overrides.setdefault(f"{tower}_num_heads", blocks[0].attn.num_heads)
    sd = convert_openai_clip_state_dict(_source(src, "the CLIP state dict"))
    fixed = dict(vision_norm_eps=1e-5, text_norm_eps=1e-5, vision_mlp=act, text_mlp=act,
                 vision_attention="standard", text_attention="standard")
    return _clip_from(sd, name, fixed, overrides, "the CLIP state dict")


def load_timm_vit(src, name: str = "vit_base_patch16_224", **overrides) -> VisionTransformer:
    """timm ViT weights (a ``timm`` model, its state dict or a file) as diffattn's ``name`` (standard
    attention, LayerNorm eps 1e-6, GELU: timm's defaults). Sizes and classes are inferred; heads come from a
    model object or default to width / 64. The start of a retrofit: swap attention afterwards."""
    if isinstance(src, nn.Module):
        blk = getattr(src, "blocks", [None])[0]
        if blk is not None and hasattr(blk.attn, "num_heads"):
            overrides.setdefault("num_heads", blk.attn.num_heads)
    sd = convert_timm_vit_state_dict(_source(src, "the timm state dict"))
    args = _vision_args(sd, "")
    args["num_classes"] = sd["head.weight"].shape[0] if "head.weight" in sd else 0
    if args.pop("attention") != "standard":
        raise ValueError("load_timm_vit takes standard-attention timm ViTs")
    args.update(overrides)
    return _load_exact(create_model(name, **args), sd, "the timm state dict")
