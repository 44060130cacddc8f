"""CLIP checkpoints users already have → diffattn's :class:`~diffattn.models.CLIP`, exactly.

- DiffCLIP release (``hammh0a/DiffCLIP_ViTB16_CC3M`` / ``_CC12M``, ``checkpoint_best.pt``; SLIP keys
  ``module.visual.blocks.i.attn.q_proj``, ``module.transformer.resblocks.i.attn.lambda_q1``, ``diff_norm``,
  ``ln_1``, ``mlp.c_fc``, ``image_projection``; Hammoud & Ghanem 2025) → :func:`load_diffclip` →
  ``diffclip_vit_b16``.
- OpenAI CLIP (``visual.conv1``, ``visual.class_embedding``, ``attn.in_proj_weight``, ``visual.proj``; Radford et al.
  2021), including the released TorchScript ``.pt`` archives (read without executing them,
  :func:`diffattn.convert.read_checkpoint`) → :func:`load_openai_clip` → ``clip_vit_b16`` with QuickGELU.
- open_clip ``ViT-B-16`` (the same keys) → :func:`load_open_clip` → ``clip_vit_b16`` with GELU; a retrofitted
  open_clip model (or base weights + a ``save_adapter`` folder) → the same CLIP, retrofitted the same way.

Each loader infers the architecture from the tensors' shapes (missing or empty tensors and absurd sizes are refused
with a ValueError before anything is built), builds the registered model with those sizes, renames the keys and
loads strictly: the result computes the same function as the source model.

Head counts are not stored in weights: differential towers reveal them through the width d of ``lambda_q1``
(h = width / d); otherwise the default is width / 64 (the rule of OpenAI CLIP, open_clip and timm ViTs) and
``vision_num_heads`` / ``text_num_heads`` override it. Neither is λ_init: it is the registered model's (``name``;
``diffclip_star_*`` for a DiffCLIP* checkpoint), or ``attention=`` says it.
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn

from ..adapters import read_adapter, retrofit, retrofit_config
from ..models.base import load_state_dict_exact
from ..models.clip import CLIP
from ..models.registry import build
from ..models.vit import VisionTransformer
from ._common import StateDict, block_count, heads_of, take, vision_args
from .checkpoint import source_state_dict

__all__ = ["convert_diffclip_state_dict", "convert_openai_clip_state_dict", "load_diffclip", "load_openai_clip",
           "load_open_clip", "clip_image_tower", "load_diffclip_image_tower"]


#: where to get the DiffCLIP release; every load_diffclip error ends with it
DIFFCLIP_RELEASE = ("The official DiffCLIP release (Hammoud & Ghanem 2025) is checkpoint_best.pt in the Hugging Face "
                    "repos hammh0a/DiffCLIP_ViTB16_CC12M and hammh0a/DiffCLIP_ViTB16_CC3M (collection "
                    "https://huggingface.co/collections/hammh0a/diffclip-67cd8d3b7c6e6ea1cc26cd93, code "
                    "https://github.com/hammoudhasan/DiffCLIP); create_model('diffclip_vit_b16', pretrained='cc12m') "
                    "fetches and verifies it")

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

    ``visual.*`` is a timm ViT whose attention has DiffCLIP's module names: kept as is. The text tower
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


def _text_args(sd: StateDict, where: str) -> dict:
    vocab, d = take(sd, "text.token_embedding.weight", where, ndim=2).shape
    depth = block_count(sd, "text.blocks.", where)
    attention, heads = heads_of(sd, "text.blocks.", d, where)
    return dict(vocab_size=vocab, context_length=take(sd, "text.pos_embed", where, ndim=2).shape[0], embed_dim=d,
                depth=depth, num_heads=heads, attention={"kind": attention},
                mlp_ratio=take(sd, "text.blocks.0.mlp.fc1.weight", where, ndim=2).shape[0] / d)


def _clip_from(sd: dict, name: str, fixed: dict, overrides: dict, what: str) -> CLIP:
    args = {"embed_dim": take(sd, "image_projection", what, ndim=2).shape[1]}
    args.update({f"vision_{k}": v for k, v in vision_args(sd, "visual.", what).items()})
    args.update({f"text_{k}": v for k, v in _text_args(sd, what).items()})
    args.update(fixed)
    # {"kind": …} of each tower, the kind the weights show, updates the registered spec (its λ_init kept), as does a
    # partial attention override of the caller (attention={"backend": "math"})
    args.update(overrides)
    return load_state_dict_exact(build(name, **args), sd, what)


# ---------------------------------------------------------------------------------------------- loaders


def load_diffclip(src, name: str = "diffclip_vit_b16", **overrides) -> CLIP:
    """The DiffCLIP release (a SLIP-style ``checkpoint_best.pt`` path, its dict or its ``state_dict``) as
    ``name`` (default ``diffclip_vit_b16``). Architecture as the DiffCLIP code: vision LayerNorm eps 1e-5,
    GELU; text QuickGELU; sizes and per-tower attention inferred (a DiffCLIP† checkpoint loads too).
    ``create_model("diffclip_vit_b16", pretrained="cc12m")`` downloads and verifies the release file first."""
    fixed = dict(vision_norm_eps=1e-5, vision_mlp="gelu", text_mlp="quick_gelu", text_norm_eps=1e-5)
    try:
        sd = convert_diffclip_state_dict(source_state_dict(src, "the DiffCLIP checkpoint"))
        return _clip_from(sd, name, fixed, overrides, "the DiffCLIP checkpoint")
    except ValueError as e:
        raise ValueError(f"{e}. {DIFFCLIP_RELEASE}") from e


def load_openai_clip(src, name: str = "clip_vit_b16", **overrides) -> CLIP:
    """OpenAI CLIP ViT weights (state dict, path, or an OpenAI/open_clip model object) as ``name``:
    QuickGELU in both towers, ``ln_pre``, bias-free patch convolution, LayerNorm eps 1e-5."""
    return _load_openai_format(src, name, "quick_gelu", overrides)


def load_open_clip(src, name: str = "clip_vit_b16", *, quick_gelu: bool | None = None, adapter=None,
                   **overrides) -> CLIP:
    """open_clip ViT weights (``ViT-B-16`` and friends; a model object, state dict or path) as ``name``.
    open_clip uses GELU unless the config ends in ``-quickgelu``; a model object tells it, a state dict needs
    ``quick_gelu=True`` for those. Head counts are read from a model object.

    Retrofitted open_clip models (:func:`diffattn.retrofit`) load too, as a diffattn CLIP retrofitted the same way
    (same method, λ_init, layers, schedule step and adapter tensors: the same function): pass the retrofitted model
    object, or the base weights with ``adapter=`` the folder :func:`diffattn.adapters.save_adapter` wrote.
    """
    if quick_gelu is None:
        quick_gelu = _uses_quick_gelu(src) if isinstance(src, nn.Module) else False
    act = "quick_gelu" if quick_gelu else "gelu"
    if adapter is None and not isinstance(src, nn.Module):
        found = _adapter_keys(source_state_dict(src, "the open_clip state dict"))
        if found:
            raise ValueError(f"load_open_clip: src holds retrofit adapter tensors ({found[0]!r}, ...) but no retrofit "
                             "config; pass the retrofitted model object, or the base weights with adapter= the folder "
                             "diffattn.adapters.save_adapter wrote")
    if adapter is None and not (isinstance(src, nn.Module) and _adapter_keys(src.state_dict())):
        return _load_openai_format(src, name, act, overrides)
    return _load_retrofitted_open_clip(src, adapter, name, act, overrides)


_ADAPTER = ".diff_adapter."


def _adapter_keys(sd) -> list[str]:
    return [k for k in sd if _ADAPTER in k]


def _retrofit_key(key: str) -> str:
    """An open_clip adapter tensor name → its name in diffattn's CLIP (the block path changes, the rest stays)."""
    m = re.match(r"(visual\.)?transformer\.resblocks\.(\d+)\.attn(\.diff_adapter\..+)$", key)
    if m is None:
        raise ValueError(f"adapter tensor {key!r} is not under an open_clip ResidualAttentionBlock's attn")
    return f"{'visual' if m.group(1) else 'text'}.blocks.{m.group(2)}.attn{m.group(3)}"


def _load_retrofitted_open_clip(src, adapter, name: str, act: str, overrides: dict) -> CLIP:
    what = "the retrofitted open_clip model"
    if isinstance(src, nn.Module):  # open_clip / OpenAI model objects know their head counts
        for tower, mod in (("vision", getattr(src, "visual", None)), ("text", src)):
            blocks = getattr(getattr(mod, "transformer", None), "resblocks", None)
            attn = getattr(blocks[0], "attn", None) if blocks is not None else None
            if attn is not None and hasattr(attn, "num_heads"):
                overrides.setdefault(f"{tower}_num_heads", int(attn.num_heads))
    sd = dict(source_state_dict(src, what))
    if adapter is not None:
        if _adapter_keys(sd):
            raise ValueError("load_open_clip: src is already retrofitted; pass adapter= only with base weights")
        config, _, tensors = read_adapter(adapter)
        sd.update(tensors)  # the adapter tensors and the attention weights the retrofit trained
    else:
        config = retrofit_config(src)
    adapters = {_retrofit_key(k): v for k, v in sd.items() if _ADAPTER in k}
    base = convert_openai_clip_state_dict({k: v for k, v in sd.items() if _ADAPTER not in k})
    fixed = dict(vision_norm_eps=1e-5, text_norm_eps=1e-5, vision_mlp=act, text_mlp=act,
                 vision_attention={"kind": "standard"}, text_attention={"kind": "standard"})
    model = _clip_from(base, name, fixed, overrides, what)
    # open_clip and diffattn's CLIP list their attention layers in the same order (image tower, then text): the
    # layer indices of the config select the same layers, and "ye" gives them the same λ_init
    retrofit(model, config)
    return load_state_dict_exact(model, {**base, **adapters}, what)


def _uses_quick_gelu(model: nn.Module) -> bool:
    return any(type(m).__name__ == "QuickGELU" for m in model.modules())


def _load_openai_format(src, name: str, act: str, overrides: dict) -> CLIP:
    if isinstance(src, nn.Module):  # open_clip / OpenAI model objects know their head counts
        for tower, mod in (("vision", getattr(src, "visual", None)), ("text", src)):
            blocks = getattr(getattr(mod, "transformer", None), "resblocks", None)
            if blocks is not None and isinstance(getattr(blocks[0], "attn", None), nn.MultiheadAttention):
                overrides.setdefault(f"{tower}_num_heads", blocks[0].attn.num_heads)
    sd = convert_openai_clip_state_dict(source_state_dict(src, "the CLIP state dict"))
    fixed = dict(vision_norm_eps=1e-5, text_norm_eps=1e-5, vision_mlp=act, text_mlp=act,
                 vision_attention={"kind": "standard"}, text_attention={"kind": "standard"})
    return _clip_from(sd, name, fixed, overrides, "the CLIP state dict")


def clip_image_tower(clip: CLIP, name: str | None = None) -> VisionTransformer:
    """CLIP's image tower as a stand-alone :class:`VisionTransformer` whose classifier is the image projection
    (weight Pᵀ, bias 0), so ``tower(images) == clip.encode_image(images)`` (B, embed_dim): timm's convention for
    CLIP image towers (e.g. timm's ``vit_base_patch16_clip_224.openai``). ``name`` (a registered vision model, e.g.
    ``diff_vit_base_patch16_224``) is recorded as ``model_name``; the tower keeps its own configuration (norm eps,
    MLP, λ_init), and ``reset_classifier(n)`` replaces the projection by a new head."""
    if not isinstance(clip, CLIP):
        raise ValueError(f"clip must be a diffattn CLIP, got {type(clip).__name__}")
    cfg = dict(clip.visual._hub_mixin_config)
    proj = clip.image_projection.detach()  # (width, embed_dim)
    cfg["num_classes"] = proj.shape[1]
    tower = VisionTransformer(**cfg).to(device=proj.device, dtype=proj.dtype)
    sd = {k: v.detach().clone() for k, v in clip.visual.state_dict().items()}
    sd["head.weight"] = proj.t().clone()
    sd["head.bias"] = torch.zeros(proj.shape[1], dtype=proj.dtype, device=proj.device)
    tower.load_state_dict(sd, strict=True)
    tower.model_name = name or getattr(clip, "model_name", None)
    return tower.train(clip.training)


def load_diffclip_image_tower(src, name: str = "diff_vit_base_patch16_224", **overrides) -> VisionTransformer:
    """The image tower of the DiffCLIP release (:func:`load_diffclip`) as DiffViT ``name`` with the image projection
    as its head (:func:`clip_image_tower`): ``create_model("diff_vit_base_patch16_224", pretrained="diffclip_cc12m")``
    and ``timm.create_model("diff_vit_base_patch16_224.diffclip_cc12m", pretrained=True)``. ``num_classes=n``
    replaces the projection by a new head of n classes (``num_classes=0``: the pooled features)."""
    num_classes = overrides.pop("num_classes", None)
    if overrides:
        raise ValueError(f"the DiffCLIP image tower takes only num_classes= as an override, got {sorted(overrides)}")
    tower = clip_image_tower(load_diffclip(src), name)
    if num_classes is not None:
        tower.reset_classifier(num_classes)
    return tower
