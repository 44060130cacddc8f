"""CLIP and DiffCLIP: two towers with a per-tower attention switch (Hammoud & Ghanem 2025, §3.3, §4).

    u = normalize(visual(I)[CLS] · P_img),   v = normalize(text(T)[EOT] · P_txt),   S = exp(t) · u vᵀ
    L_CLIP = ½ (CE(S, diag) + CE(Sᵀ, diag)),  exp(t) clamped at 100, t initialised to log(1/0.07)

Image tower: :class:`~diffattn.models.vit.VisionTransformer` with ``num_classes=0`` (CLS pooling, final norm).
Text tower: :class:`TextTransformer`, causal pre-norm blocks (width 512, 12 layers, 8 heads, context 77,
vocabulary 49408), pooled at the EOT token (the largest token id, as in CLIP), QuickGELU MLPs like the
SLIP/DiffCLIP code. Both towers take ``attention``, an :class:`~diffattn.layers.AttentionSpec` or its dict (``kind``
``"standard" | "diff" | "gated"``, ``lambda_init``, …).

Registered: the literal table :data:`CLIP_CONFIGS` (``{size}`` is ``vit_b16``, ``vit_s16``, ``vit_ti16`` or ``tiny``):

- ``clip_{size}``: standard attention in both towers (Radford et al. 2021; DiffCLIP's baseline).
- ``diffclip_{size}``: differential attention in both towers, λ_init = 0.8 (Hammoud & Ghanem 2025, §4.1).
- ``diffclip_star_{size}``: DiffCLIP*, λ_init = 0.8 − 0.6·exp(−0.3·l), l the 0-based layer (§4.5).
- ``diffclip_dagger_{size}``: DiffCLIP†, differential attention in the vision tower only (§4.6).
- ``dgclip_{size}``: gated differential attention (M-DGSA 2025) in both towers, λ_init 0.8, no
  [Q⁺; Q⁻] residual (``vision_attention={"q_residual": True}`` adds DGViT's).

ViT-S/16 and ViT-Ti/16 change the image tower only (text 512/12/8, embedding 512). ViT-Ti's 3 heads cannot
pair, so its differential and gated towers use 6 standard heads (3 differential heads of value width 64).
``tiny`` (32×32 images, patch 4, width 64, 2 layers; text width 64, 2 layers, context 32) trains on a CPU
in minutes.

Overrides (:mod:`diffattn.models.registry`): ``attention={...}`` updates both towers' specs;
``vision_<arg>=`` / ``text_<arg>=`` set one argument of one tower (``vision_depth=2``, ``text_embed_dim=64``,
``vision_attention={"kind": "diff"}`` updates the vision tower's spec); ``embed_dim`` is the shared space. Vision
LayerNorms use eps 1e-5 as the DiffCLIP release, OpenAI CLIP and open_clip do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cached_property

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..layers import AttentionSpec, Block, LooseAttention
from ..losses import clip_loss
from .base import DiffattnModel
from .config import check_args, check_size
from .registry import ModelFamily, inspect_args, loose_args, register_family
from .vit import IMAGENET_MEAN, IMAGENET_STD, VisionTransformer

__all__ = ["CLIP", "TextTransformer", "CLIP_CONFIGS", "clip_loss", "image_transform", "IMAGENET_MEAN",
           "IMAGENET_STD"]


_CAUSAL = AttentionSpec(causal=True)  # the default of a text tower


class TextTransformer(nn.Module):
    """CLIP's causal text encoder (Radford et al. 2021; SLIP/DiffCLIP code), pooled at the EOT token.

        x = E[tokens] + P[:L];  x = blocks(x) (causal);  x = norm(x);  out = x[b, argmax_t tokens[b, t]]

    tokens (B, L) int64, L ≤ ``context_length`` → (B, embed_dim). The EOT token has the largest id of the BPE
    vocabulary (49407), so argmax finds it; padding (id 0) after it is never attended by earlier positions.
    ``attention`` is an :class:`~diffattn.layers.AttentionSpec` or its dict (made causal whatever it says);
    ``drop_rate`` the MLP's dropout. The loose keywords of before (:data:`LOOSE`) are deprecated
    (:class:`~diffattn.layers.LooseAttention`).
    """

    #: the spelling of before: ``attention="diff", lambda_init=…``, where ``drop_rate`` was ``proj_drop`` too
    LOOSE = LooseAttention("TextTransformer", ("lambda_init", "lambda_form", "sub_norm", "qkv_bias", "q_residual",
                                               "attn_drop_rate", "backend"), fill={"proj_drop": "drop_rate"},
                           force={"causal": True})

    def __init__(self, vocab_size: int = 49408, context_length: int = 77, embed_dim: int = 512,
                 depth: int = 12, num_heads: int = 8, attention: AttentionSpec | Mapping = _CAUSAL,
                 mlp: str = "quick_gelu", mlp_ratio: float = 4.0, norm_eps: float = 1e-5, drop_rate: float = 0.0,
                 **loose):
        super().__init__()
        check_args("TextTransformer", vocab_size=vocab_size, context_length=context_length, embed_dim=embed_dim,
                   depth=depth, num_heads=num_heads, norm_eps=norm_eps, drop_rate=drop_rate)
        spec = self.LOOSE.resolve(attention, loose, {"drop_rate": drop_rate})
        self.attention_spec = spec
        self.vocab_size, self.context_length = vocab_size, context_length
        self.embed_dim, self.depth = embed_dim, depth
        self.token_embedding = nn.Embedding(vocab_size, embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(context_length, embed_dim))
        self.blocks = nn.ModuleList([
            Block(embed_dim, num_heads, depth=i, attention=spec, mlp=mlp, mlp_ratio=mlp_ratio, norm_eps=norm_eps,
                  drop=drop_rate)
            for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.grad_checkpointing = False
        self.init_weights()

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass (``torch.utils.checkpoint``): less memory, the same gradients."""
        if not isinstance(enable, bool):
            raise TypeError(f"enable must be a bool, got {type(enable).__name__}")
        self.grad_checkpointing = enable

    @torch.no_grad()
    def init_weights(self) -> None:
        """OpenAI CLIP's text init (kept by SLIP and DiffCLIP): embeddings N(0, 0.02²), positions N(0, 0.01²),
        q/k/v N(0, 1/w), out and fc2 N(0, 1/(2·w·depth)), fc1 N(0, 1/(2w)); λ vectors keep their own init."""
        if self.pos_embed.device.type == "meta":
            return
        w = self.embed_dim
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.01)
        proj_std, attn_std, fc_std = (w**-0.5) * ((2 * self.depth) ** -0.5), w**-0.5, (2 * w) ** -0.5
        for blk in self.blocks:
            for name in ("q_proj", "k_proj", "v_proj"):
                nn.init.normal_(getattr(blk.attn, name).weight, std=attn_std)
            nn.init.normal_(blk.attn.out_proj.weight, std=proj_std)
            first = blk.mlp.fc1 if hasattr(blk.mlp, "fc1") else blk.mlp.gate_proj
            last = blk.mlp.fc2 if hasattr(blk.mlp, "fc2") else blk.mlp.down_proj
            nn.init.normal_(first.weight, std=fc_std)
            nn.init.normal_(last.weight, std=proj_std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, L) → EOT features (B, embed_dim)."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype not in (torch.int64,
                                                                                             torch.int32):
            got = (f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, torch.Tensor)
                   else type(tokens).__name__)
            raise ValueError(f"tokens must be an integer tensor of shape (B, L), got {got}")
        if tokens.shape[1] > self.context_length:
            raise ValueError(f"tokens must have at most context_length={self.context_length} positions, "
                             f"got {tokens.shape[1]}")
        x = self.token_embedding(tokens) + self.pos_embed[: tokens.shape[1]]  # (B, L, D)
        ckpt = self.grad_checkpointing and torch.is_grad_enabled()
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if ckpt else blk(x)
        x = self.norm(x)
        return x[torch.arange(x.shape[0], device=x.device), tokens.argmax(dim=-1)]  # (B, D)


class _ToRGB:
    """PIL image → RGB (picklable, for DataLoader workers)."""

    def __call__(self, img):
        return img.convert("RGB") if hasattr(img, "convert") else img


def image_transform(img_size: int = 224, train: bool = False, *, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """DiffCLIP's image transforms (the SLIP recipe; Hammoud & Ghanem 2025, §4.1): train = RandomResizedCrop(scale
    0.5–1) → tensor → normalise; eval = Resize(shorter side) → CenterCrop → tensor → normalise. ImageNet mean/std."""
    from torchvision import transforms as T

    if not isinstance(img_size, int) or img_size < 1:
        raise ValueError(f"img_size must be a positive integer, got {img_size!r}")
    if train:
        ops = [T.RandomResizedCrop(img_size, scale=(0.5, 1.0), interpolation=T.InterpolationMode.BICUBIC)]
    else:
        ops = [T.Resize(img_size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(img_size)]
    return T.Compose([_ToRGB(), *ops, T.ToTensor(), T.Normalize(mean, std)])


_TOWERS = {"vision": VisionTransformer, "text": TextTransformer}


def _one_of(name: str, value, alias: str, other):
    if value is not None and other is not None:
        raise ValueError(f"pass {name} or {alias} (open_clip's name), not both")
    return value if value is not None else other


class CLIP(DiffattnModel):
    """Contrastive image–text model with per-tower attention (Hammoud & Ghanem 2025, §3.3).

    ``vision`` and ``text`` are the keyword arguments of :class:`VisionTransformer` (``num_classes`` is forced
    to 0) and :class:`TextTransformer`; ``embed_dim`` is the width of the shared space. The projections are
    plain matrices, ``image_projection`` (vision width, embed_dim) and ``text_projection`` (text width,
    embed_dim), as in the DiffCLIP release. ``logit_scale`` t is learnable; exp(t) is clamped at
    ``max_logit_scale`` (100) where used; :meth:`clamp_logit_scale_` clamps t in place after a step (SLIP).
    """

    tower_classes = _TOWERS

    def __init__(self, embed_dim: int = 512, vision: dict | None = None, text: dict | None = None,
                 init_logit_scale: float = math.log(1 / 0.07), max_logit_scale: float = 100.0):
        super().__init__()
        check_size("embed_dim", embed_dim, owner="CLIP")
        check_args("CLIP", max_logit_scale=max_logit_scale)
        for name, cfg in (("vision", vision), ("text", text)):
            if cfg is not None and not isinstance(cfg, dict):
                raise ValueError(f"{name} must be a dict of tower arguments or None, "
                                 f"got {type(cfg).__name__}")
            allowed = inspect_args(_TOWERS[name]) + loose_args(_TOWERS[name])
            unknown = sorted(set(cfg or {}) - set(allowed))
            if unknown:
                raise ValueError(f"{name} has unknown arguments {unknown}; allowed: {list(allowed)}")
        self.max_logit_scale = float(max_logit_scale)
        self.visual = VisionTransformer(**{**(vision or {}), "num_classes": 0})
        self.text = TextTransformer(**(text or {}))
        self.image_projection = nn.Parameter(torch.empty(self.visual.embed_dim, embed_dim))
        self.text_projection = nn.Parameter(torch.empty(self.text.embed_dim, embed_dim))
        self.logit_scale = nn.Parameter(torch.tensor(float(init_logit_scale)))
        if self.logit_scale.device.type != "meta":
            nn.init.normal_(self.image_projection, std=self.visual.embed_dim**-0.5)
            nn.init.normal_(self.text_projection, std=self.text.embed_dim**-0.5)

    @property
    def img_size(self) -> int:
        return self.visual.patch_embed.img_size

    @property
    def context_length(self) -> int:
        return self.text.context_length

    def encode_image(self, images: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """images (B, 3, H, W) → (B, embed_dim): CLS features · image_projection."""
        x = self.visual(images) @ self.image_projection
        return F.normalize(x, dim=-1) if normalize else x

    def encode_text(self, tokens: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """tokens (B, L) → (B, embed_dim): EOT features · text_projection."""
        x = self.text(tokens) @ self.text_projection
        return F.normalize(x, dim=-1) if normalize else x

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Gradient checkpointing in both towers (open_clip's and timm's ``set_grad_checkpointing``)."""
        self.visual.set_grad_checkpointing(enable)
        self.text.set_grad_checkpointing(enable)

    def no_weight_decay(self) -> set[str]:
        """Parameters to keep out of weight decay (timm's optimizer factory reads it): ``logit_scale``, the token
        and position embeddings of both towers and every λ parameter."""
        names = {f"visual.{n}" for n in self.visual.no_weight_decay()} | {"logit_scale", "text.pos_embed"}
        return names | {n for n, _ in self.text.named_parameters(prefix="text")
                        if n.rsplit(".", 1)[-1].startswith("lambda")}

    def scale(self) -> torch.Tensor:
        """exp(logit_scale) clamped at ``max_logit_scale``."""
        return self.logit_scale.exp().clamp(max=self.max_logit_scale)

    @torch.no_grad()
    def clamp_logit_scale_(self) -> None:
        """Clamp t to [0, log(max_logit_scale)] in place (SLIP does this after each optimiser step)."""
        self.logit_scale.clamp_(0, math.log(self.max_logit_scale))

    #: open_clip's output convention (``open_clip.CLIP(output_dict=...)``): None (default) gives diffattn's dict
    #: below; True open_clip's dict, False open_clip's tuple. ``diffattn.create_model_and_transforms`` sets it.
    output_dict: bool | None = None

    def forward(self, images: torch.Tensor | None = None, tokens: torch.Tensor | None = None, *,
                image: torch.Tensor | None = None, text: torch.Tensor | None = None):
        """images (B_i, 3, H, W), tokens (B_t, L) → dict with ``image_embed`` (B_i, E) and ``text_embed``
        (B_t, E), both L2-normalised, ``logit_scale`` (exp, clamped), ``logits_per_image`` (B_i, B_t) and
        ``logits_per_text`` (B_t, B_i). :func:`clip_loss` takes ``logits_per_image``.

        open_clip's calling convention works too: ``image=`` / ``text=`` as keywords, either one alone, and with
        :attr:`output_dict` True the dict ``{"image_features", "text_features", "logit_scale"}`` (features
        L2-normalised, None for a missing input; what open_clip's ``ClipLoss`` takes as ``**kwargs``), with False
        the tuple ``(image_features, text_features, logit_scale)``."""
        images = _one_of("images", images, "image", image)
        tokens = _one_of("tokens", tokens, "text", text)
        if self.output_dict is None:
            if images is None or tokens is None:
                raise ValueError("CLIP.forward needs both images and tokens (set model.output_dict = True for "
                                 "open_clip's convention, which accepts either one alone)")
            u = self.encode_image(images, normalize=True)
            v = self.encode_text(tokens, normalize=True)
            s = self.scale()
            logits = s * u @ v.t()
            return {"image_embed": u, "text_embed": v, "logit_scale": s, "logits_per_image": logits,
                    "logits_per_text": logits.t()}
        u = self.encode_image(images, normalize=True) if images is not None else None
        v = self.encode_text(tokens, normalize=True) if tokens is not None else None
        s = self.scale()
        if self.output_dict:
            return {"image_features": u, "text_features": v, "logit_scale": s}
        return u, v, s

    @cached_property
    def tokenizer(self):
        """open_clip's bundled CLIP BPE tokenizer (works offline) with this model's context length:
        ``model.tokenizer(["a photo of a cat"])`` → (B, context_length) int64."""
        from open_clip.tokenizer import SimpleTokenizer

        return SimpleTokenizer(context_length=self.context_length)

    def tokenize(self, texts: str | list[str]) -> torch.Tensor:
        return self.tokenizer(texts)

    def image_transform(self, train: bool = False):
        """DiffCLIP's train (RandomResizedCrop 0.5–1) or eval (Resize + CenterCrop) transform at this size."""
        return image_transform(self.img_size, train)

    @property
    def train_transform(self):
        return self.image_transform(train=True)

    @property
    def eval_transform(self):
        return self.image_transform(train=False)


# --------------------------------------------------------------------------------------------- registry

# Towers of the CLIP sizes: ViT-B/16, ViT-S/16, ViT-Ti/16 image towers (224², patch 16, vision LayerNorm eps 1e-5 as
# the DiffCLIP release, OpenAI CLIP and open_clip) with CLIP's text tower (512 wide, 12 layers, 8 heads, context 77,
# QuickGELU); "tiny" is a CPU size. ViT-Ti's 3 heads cannot pair: its differential and gated towers use 6.
_B16 = dict(img_size=224, patch_size=16, mlp="gelu", norm_eps=1e-5, embed_dim=768, depth=12, num_heads=12)
_S16 = dict(img_size=224, patch_size=16, mlp="gelu", norm_eps=1e-5, embed_dim=384, depth=12, num_heads=6)
_TI16 = dict(img_size=224, patch_size=16, mlp="gelu", norm_eps=1e-5, embed_dim=192, depth=12, num_heads=3)
_TI16_PAIRED = dict(_TI16, num_heads=6)
_TINY = dict(img_size=32, patch_size=4, mlp="gelu", norm_eps=1e-5, embed_dim=64, depth=2, num_heads=4)
_TEXT = dict(vocab_size=49408, context_length=77, embed_dim=512, depth=12, num_heads=8, mlp="quick_gelu")
_TEXT_TINY = dict(vocab_size=49408, context_length=32, embed_dim=64, depth=2, num_heads=4, mlp="quick_gelu")

_STD, _DIFF, _YE, _DG = (dict(kind="standard"), dict(kind="diff"), dict(kind="diff", lambda_init="ye"),
                         dict(kind="gated"))
CLIP_CONFIGS: dict[str, dict] = {
    # CLIP: standard attention in both towers
    "clip_vit_b16": dict(embed_dim=512, vision=dict(_B16, attention=_STD),
                         text=dict(_TEXT, attention=_STD)),
    "clip_vit_s16": dict(embed_dim=512, vision=dict(_S16, attention=_STD),
                         text=dict(_TEXT, attention=_STD)),
    "clip_vit_ti16": dict(embed_dim=512, vision=dict(_TI16, attention=_STD),
                          text=dict(_TEXT, attention=_STD)),
    "clip_tiny": dict(embed_dim=64, vision=dict(_TINY, attention=_STD),
                      text=dict(_TEXT_TINY, attention=_STD)),
    # DiffCLIP: differential attention in both towers, λ_init 0.8 (the default)
    "diffclip_vit_b16": dict(embed_dim=512, vision=dict(_B16, attention=_DIFF),
                             text=dict(_TEXT, attention=_DIFF)),
    "diffclip_vit_s16": dict(embed_dim=512, vision=dict(_S16, attention=_DIFF),
                             text=dict(_TEXT, attention=_DIFF)),
    "diffclip_vit_ti16": dict(embed_dim=512, vision=dict(_TI16_PAIRED, attention=_DIFF),
                              text=dict(_TEXT, attention=_DIFF)),
    "diffclip_tiny": dict(embed_dim=64, vision=dict(_TINY, attention=_DIFF),
                          text=dict(_TEXT_TINY, attention=_DIFF)),
    # DiffCLIP*: the depth schedule λ_init = 0.8 − 0.6·exp(−0.3·l)
    "diffclip_star_vit_b16": dict(embed_dim=512, vision=dict(_B16, attention=_YE),
                                  text=dict(_TEXT, attention=_YE)),
    "diffclip_star_vit_s16": dict(embed_dim=512, vision=dict(_S16, attention=_YE),
                                  text=dict(_TEXT, attention=_YE)),
    "diffclip_star_vit_ti16": dict(embed_dim=512, vision=dict(_TI16_PAIRED, attention=_YE),
                                   text=dict(_TEXT, attention=_YE)),
    "diffclip_star_tiny": dict(embed_dim=64, vision=dict(_TINY, attention=_YE),
                               text=dict(_TEXT_TINY, attention=_YE)),
    # DiffCLIP†: differential attention in the vision tower only
    "diffclip_dagger_vit_b16": dict(embed_dim=512, vision=dict(_B16, attention=_DIFF),
                                    text=dict(_TEXT, attention=_STD)),
    "diffclip_dagger_vit_s16": dict(embed_dim=512, vision=dict(_S16, attention=_DIFF),
                                    text=dict(_TEXT, attention=_STD)),
    "diffclip_dagger_vit_ti16": dict(embed_dim=512, vision=dict(_TI16_PAIRED, attention=_DIFF),
                                     text=dict(_TEXT, attention=_STD)),
    "diffclip_dagger_tiny": dict(embed_dim=64, vision=dict(_TINY, attention=_DIFF),
                                 text=dict(_TEXT_TINY, attention=_STD)),
    # DGCLIP: M-DGSA in both towers, λ_init 0.8, no [Q⁺; Q⁻] residual
    "dgclip_vit_b16": dict(embed_dim=512, vision=dict(_B16, attention=_DG),
                           text=dict(_TEXT, attention=_DG)),
    "dgclip_vit_s16": dict(embed_dim=512, vision=dict(_S16, attention=_DG),
                           text=dict(_TEXT, attention=_DG)),
    "dgclip_vit_ti16": dict(embed_dim=512, vision=dict(_TI16_PAIRED, attention=_DG),
                            text=dict(_TEXT, attention=_DG)),
    "dgclip_tiny": dict(embed_dim=64, vision=dict(_TINY, attention=_DG),
                        text=dict(_TEXT_TINY, attention=_DG)),
}

register_family(ModelFamily(CLIP, CLIP_CONFIGS, __name__, "CLIP (Hammoud & Ghanem 2025).", towers=_TOWERS))
