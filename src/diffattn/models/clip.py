"""CLIP and DiffCLIP: two towers with a per-tower attention switch (seed 000 §3.3, §4; SLIP/DiffCLIP lineage).

    u = normalize(visual(I)[CLS] · P_img),   v = normalize(text(T)[EOT] · P_txt),   S = exp(t) · u vᵀ
    L_CLIP = ½ (CE(S, diag) + CE(Sᵀ, diag)),  exp(t) clamped at 100, t initialised to log(1/0.07)

Image tower: :class:`~diffattn.models.vit.VisionTransformer` with ``num_classes=0`` (CLS pooling, final norm).
Text tower: :class:`TextTransformer`, causal pre-norm blocks (width 512, 12 layers, 8 heads, context 77,
vocabulary 49408), pooled at the EOT token (the largest token id, as in CLIP), QuickGELU MLPs like the
SLIP/DiffCLIP code. Both towers take ``attention="standard" | "diff" | "gated"`` and ``lambda_init``.

Registered names (``{size}`` is ``vit_b16``, ``vit_s16``, ``vit_ti16`` or ``tiny``):

- ``clip_{size}``: standard attention in both towers (seed 000's baseline).
- ``diffclip_{size}``: differential attention in both towers, λ_init = 0.8 (seed 000 §4.1).
- ``diffclip_star_{size}``: DiffCLIP*, λ_init = 0.8 − 0.6·exp(−0.3·l), l the 0-based layer (seed 000 §4.5).
- ``diffclip_dagger_{size}``: DiffCLIP†, differential attention in the vision tower only (seed 000 §4.6).
- ``dgclip_{size}``: gated differential attention (M-DGSA, seed 004) in both towers, λ_init 0.8, no
  [Q⁺; Q⁻] residual (``vision_q_residual=True`` adds DGViT's).

ViT-S/16 and ViT-Ti/16 change the image tower only (text 512/12/8, embedding 512). ViT-Ti's 3 heads cannot
pair, so its differential and gated towers use 6 standard heads (3 differential heads of value width 64).
``tiny`` (32×32 images, patch 4, width 64, 2 layers; text width 64, 2 layers, context 32) trains on a CPU
in minutes.

Overrides: ``attention=`` and ``lambda_init=`` set both towers; ``vision_<arg>=`` / ``text_<arg>=`` set one
argument of one tower (``vision_depth=2``, ``text_embed_dim=64``, ``vision_attention="diff"``); ``embed_dim``
is the shared space. Vision LayerNorms use eps 1e-5 as the DiffCLIP release, OpenAI CLIP and open_clip do.
"""

from __future__ import annotations

import inspect
import math
from functools import cached_property

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..lambdas import resolve_lambda_init
from ..layers import attention_class
from ..losses import clip_loss
from .base import DiffattnModel
from .registry import register_builder
from .vit import Block, VisionTransformer

__all__ = ["CLIP", "TextTransformer", "clip_loss", "image_transform", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class TextTransformer(nn.Module):
    """CLIP's causal text encoder (Radford et al. 2021; SLIP/DiffCLIP code), pooled at the EOT token.

        x = E[tokens] + P[:L];  x = blocks(x) (causal);  x = norm(x);  out = x[b, argmax_t tokens[b, t]]

    tokens (B, L) int64, L ≤ ``context_length`` → (B, embed_dim). The EOT token has the largest id of the BPE
    vocabulary (49407), so argmax finds it; padding (id 0) after it is never attended by earlier positions.
    """

    def __init__(self, vocab_size: int = 49408, context_length: int = 77, embed_dim: int = 512,
                 depth: int = 12, num_heads: int = 8, attention: str = "standard",
                 lambda_init: float | str = 0.8, mlp: str = "quick_gelu", mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, q_residual: bool = False, norm_eps: float = 1e-5,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, backend: str = "auto"):
        super().__init__()
        for name, v in (("vocab_size", vocab_size), ("context_length", context_length),
                        ("embed_dim", embed_dim), ("depth", depth), ("num_heads", num_heads)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        attention_class(attention)
        resolve_lambda_init(lambda_init, 0)
        self.vocab_size, self.context_length = vocab_size, context_length
        self.embed_dim, self.depth = embed_dim, depth
        self.token_embedding = nn.Embedding(vocab_size, embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(context_length, embed_dim))
        self.blocks = nn.ModuleList([
            Block(embed_dim, num_heads, depth=i, attention=attention, lambda_init=lambda_init, mlp=mlp,
                  mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, q_residual=q_residual, causal=True,
                  norm_eps=norm_eps, drop=drop_rate, attn_drop=attn_drop_rate, backend=backend)
            for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.init_weights()

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
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        return x[torch.arange(x.shape[0], device=x.device), tokens.argmax(dim=-1)]  # (B, D)


class _ToRGB:
    """PIL image → RGB (picklable, for DataLoader workers)."""

    def __call__(self, img):
        return img.convert("RGB") if hasattr(img, "convert") else img


def image_transform(img_size: int = 224, train: bool = False, *, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """Seed 000's image transforms (SLIP recipe): train = RandomResizedCrop(scale 0.5–1) → tensor → normalise;
    eval = Resize(shorter side) → CenterCrop → tensor → normalise. ImageNet mean/std."""
    from torchvision import transforms as T

    if not isinstance(img_size, int) or img_size < 1:
        raise ValueError(f"img_size must be a positive integer, got {img_size!r}")
    if train:
        ops = [T.RandomResizedCrop(img_size, scale=(0.5, 1.0), interpolation=T.InterpolationMode.BICUBIC)]
    else:
        ops = [T.Resize(img_size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(img_size)]
    return T.Compose([_ToRGB(), *ops, T.ToTensor(), T.Normalize(mean, std)])


_VISION_ARGS = tuple(inspect.signature(VisionTransformer.__init__).parameters)[1:]
_TEXT_ARGS = tuple(inspect.signature(TextTransformer.__init__).parameters)[1:]


class CLIP(DiffattnModel):
    """Contrastive image–text model with per-tower attention (seed 000 §3.3).

    ``vision`` and ``text`` are the keyword arguments of :class:`VisionTransformer` (``num_classes`` is forced
    to 0) and :class:`TextTransformer`; ``embed_dim`` is the width of the shared space. The projections are
    plain matrices, ``image_projection`` (vision width, embed_dim) and ``text_projection`` (text width,
    embed_dim), as in the DiffCLIP release. ``logit_scale`` t is learnable; exp(t) is clamped at
    ``max_logit_scale`` (100) where used; :meth:`clamp_logit_scale_` clamps t in place after a step (SLIP).
    """

    def __init__(self, embed_dim: int = 512, vision: dict | None = None, text: dict | None = None,
                 init_logit_scale: float = math.log(1 / 0.07), max_logit_scale: float = 100.0):
        super().__init__()
        if not isinstance(embed_dim, int) or isinstance(embed_dim, bool) or embed_dim < 1:
            raise ValueError(f"embed_dim must be an integer >= 1, got {embed_dim!r}")
        for name, cfg, allowed in (("vision", vision, _VISION_ARGS), ("text", text, _TEXT_ARGS)):
            if cfg is not None and not isinstance(cfg, dict):
                raise ValueError(f"{name} must be a dict of tower arguments or None, "
                                 f"got {type(cfg).__name__}")
            unknown = sorted(set(cfg or {}) - set(allowed) - ({"num_classes"} if name == "vision" else set()))
            if unknown:
                raise ValueError(f"{name} has unknown arguments {unknown}; allowed: {list(allowed)}")
        if not max_logit_scale > 0:
            raise ValueError(f"max_logit_scale must be > 0, got {max_logit_scale!r}")
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

    def scale(self) -> torch.Tensor:
        """exp(logit_scale) clamped at ``max_logit_scale``."""
        return self.logit_scale.exp().clamp(max=self.max_logit_scale)

    @torch.no_grad()
    def clamp_logit_scale_(self) -> None:
        """Clamp t to [0, log(max_logit_scale)] in place (SLIP does this after each optimiser step)."""
        self.logit_scale.clamp_(0, math.log(self.max_logit_scale))

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """images (B_i, 3, H, W), tokens (B_t, L) → dict with ``image_embed`` (B_i, E) and ``text_embed``
        (B_t, E), both L2-normalised, ``logit_scale`` (exp, clamped), ``logits_per_image`` (B_i, B_t) and
        ``logits_per_text`` (B_t, B_i). :func:`clip_loss` takes ``logits_per_image``."""
        u = self.encode_image(images, normalize=True)
        v = self.encode_text(tokens, normalize=True)
        s = self.scale()
        logits = s * u @ v.t()
        return {"image_embed": u, "text_embed": v, "logit_scale": s, "logits_per_image": logits,
                "logits_per_text": logits.t()}

    @cached_property
    def tokenizer(self):
        """open_clip's bundled CLIP BPE tokenizer (works offline) with this model's context length:
        ``model.tokenizer(["a photo of a cat"])`` → (B, context_length) int64."""
        from open_clip.tokenizer import SimpleTokenizer

        return SimpleTokenizer(context_length=self.context_length)

    def tokenize(self, texts: str | list[str]) -> torch.Tensor:
        return self.tokenizer(texts)

    def image_transform(self, train: bool = False):
        """Seed 000's train (RandomResizedCrop 0.5–1) or eval (Resize + CenterCrop) transform at this size."""
        return image_transform(self.img_size, train)

    @property
    def train_transform(self):
        return self.image_transform(train=True)

    @property
    def eval_transform(self):
        return self.image_transform(train=False)


# --------------------------------------------------------------------------------------------- registry

_TEXT = dict(vocab_size=49408, context_length=77, embed_dim=512, depth=12, num_heads=8, mlp="quick_gelu")
_VISION = dict(img_size=224, patch_size=16, mlp="gelu", norm_eps=1e-5)
_SIZES = {
    "vit_b16": (dict(_VISION, embed_dim=768, depth=12, num_heads=12), dict(_TEXT), 512),
    "vit_s16": (dict(_VISION, embed_dim=384, depth=12, num_heads=6), dict(_TEXT), 512),
    "vit_ti16": (dict(_VISION, embed_dim=192, depth=12, num_heads=3), dict(_TEXT), 512),
    "tiny": (dict(_VISION, img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4),
             dict(_TEXT, context_length=32, embed_dim=64, depth=2, num_heads=4), 64),
}
# variant: (vision attention, text attention, lambda_init)
_VARIANTS = {
    "clip": ("standard", "standard", 0.8),
    "diffclip": ("diff", "diff", 0.8),
    "diffclip_star": ("diff", "diff", "ye"),
    "diffclip_dagger": ("diff", "standard", 0.8),
    "dgclip": ("gated", "gated", 0.8),
}
_TOP = ("embed_dim", "init_logit_scale", "max_logit_scale")


def clip_config(name: str) -> dict:
    """The CLIP constructor arguments of registered model ``name`` (``{variant}_{size}``)."""
    for variant, (va, ta, lam) in _VARIANTS.items():
        for size, (vcfg, tcfg, dim) in _SIZES.items():
            if name == f"{variant}_{size}":
                vision = {**vcfg, "attention": va, "lambda_init": lam}
                if va != "standard" and vision["num_heads"] % 2:
                    vision["num_heads"] *= 2  # ViT-Ti: 3 heads cannot pair (module docstring)
                text = {**tcfg, "attention": ta, "lambda_init": lam}
                return {"embed_dim": dim, "vision": vision, "text": text}
    raise ValueError(f"name must be a registered CLIP model, got {name!r}")


def _create(name: str, overrides: dict) -> CLIP:
    cfg = clip_config(name)
    both = {k: overrides.pop(k) for k in ("attention", "lambda_init") if k in overrides}
    cfg["vision"].update(both)
    cfg["text"].update(both)
    for key, value in overrides.items():
        if key in _TOP:
            cfg[key] = value
        elif key.startswith("vision_") and key[7:] in _VISION_ARGS:
            cfg["vision"][key[7:]] = value
        elif key.startswith("text_") and key[5:] in _TEXT_ARGS:
            cfg["text"][key[5:]] = value
        else:
            raise ValueError(f"override {key!r} is not understood: use {list(_TOP)}, attention, lambda_init, "
                             f"vision_<arg> (arg in {list(_VISION_ARGS)}) or "
                             f"text_<arg> (arg in {list(_TEXT_ARGS)})")
    return CLIP(**cfg)


CLIP_NAMES = [f"{v}_{s}" for v in _VARIANTS for s in _SIZES]
for _name in CLIP_NAMES:
    globals()[_name] = register_builder(_name, lambda overrides, n=_name: _create(n, overrides),
                                        f"{_name}: CLIP({clip_config(_name)!r}).", __name__)
    __all__.append(_name)
del _name
