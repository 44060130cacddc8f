"""Vision transformers with a switchable attention: ViT, DiffViT (DViT) and DGViT.

    x (B, C, H, W) ─ patch_embed ─ [CLS; patches] + pos_embed ─ norm_pre ─ blocks ─ norm ─ pool ─ head
    block:  x = x + drop_path(attn(norm1(x)));   x = x + drop_path(mlp(norm2(x)))        (pre-norm)

One class, :class:`VisionTransformer`, serves every variant. ``attention="standard" | "diff" | "gated"``
picks the layer (:func:`diffattn.layers.attention_class`); everything else is shared, so the state-dict keys
outside ``blocks.*.attn`` are the same for all three (a fair comparison). Parameter names follow timm
(``patch_embed.proj``, ``cls_token``, ``pos_embed``, ``blocks.i.norm1``/``mlp.fc1``/``norm2``, ``norm``,
``head``) and the attention layers keep seed 003's names (``q_proj``… ``diff_norm``, ``lambda_q1``…),
which are also the names of the DiffCLIP release's vision tower.

Registered families (``diffattn.models.create_model(name, **overrides)``):

- ``vit_nano``, ``vit_cifar``, ``vit_{tiny,small,base}_patch16_224``: standard attention, GELU MLP ×4
  (Dosovitskiy et al. 2021; ``vit_cifar`` is seed 004's "ViTx4", App. B Tables 4 and 9).
- ``diff_vit_nano``, ``diff_vit_{tiny,small,base}_patch16_224``: the same with differential attention only
  (DiffCLIP's ``diff_vit_base_patch16_224``, seed 000 §4.1: "every attention layer ... replaced").
- ``diff_vit_cifar_x{2,4,16_3}``: seed 004's DViT, differential attention + SwiGLU ×2/×4/×16/3, 2 dropouts.
- ``dg_vit_cifar_x{2,4,16_3}``, ``dg_vit_nano``, ``dg_vit_{tiny,small,base}_patch16_224``: seed 004's DGViT
  (§4.3): M-DGSA with the [Q⁺; Q⁻] residual and a SwiGLU FFN (×4 unless the name says otherwise).

Conventions and choices (say them, never guess):
- ``num_heads`` is the standard head count h (DESIGN.md §3.1); differential layers have h/2 heads. Seed 004
  counts *differential* heads: its "8 heads" at width 256 are h = 16 here (head width d = 16). Its App. B.4
  Table 9 implies it: DGViTx4 − DViTx4 = 8 layers × (256·8 + 8 gate weights − 4·16 λ values) = 15,936.
- ViT-Ti has 3 standard heads, which cannot pair; ``diff_vit_tiny*`` and ``dg_vit_tiny*`` use h = 6
  (3 differential heads whose value width 64 equals the baseline's head width).
- SwiGLU expansion r (seed 004: ×2, ×4, ×16/3) is the width of the fused first projection, as in the seed's
  parameter counts: gate and up projections of width ⌊r·D/2⌋ each (×4 → 2D), down projection back to D.
  ``mlp_ratio`` is r for ``mlp="swiglu"`` and the hidden width ratio for the GELU MLPs.
- Dropout layouts (seed 004 Table 1, "one or two dropout layers"): ``mlp_dropouts=1`` puts one dropout between
  the activation and the down projection; ``mlp_dropouts=2`` adds one after the down projection (as timm).
  ``drop_rate`` is also used after the position embedding and the attention output projection.
- ``lambda_init``: a float (0.8, DiffCLIP and seed 004 App. B.5) or ``"ye"``: 0.8 − 0.6·exp(−0.3·l) with l the
  **0-based** block index (block 0 gets 0.2).

timm: after ``import diffattn.models`` each vision model is also in timm's registry as ``diffattn_<name>``,
and under its own name where timm has no model of that name (``diff_vit_*``, ``dg_vit_*``, ``vit_nano``,
``vit_cifar``; timm's own ``vit_*_patch16_224`` are never overridden).
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn as nn

from ..lambdas import resolve_lambda_init
from ..layers import Mlp, SwiGLU, attention_class
from .base import DiffattnModel
from .registry import model_builder, register_builder

__all__ = ["VisionTransformer", "Block", "PatchEmbed", "QuickGELU", "DropPath", "MLP_TYPES", "build_mlp"]

MLP_TYPES = ("gelu", "quick_gelu", "swiglu")
_TIMM_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


class QuickGELU(nn.Module):
    """x · σ(1.702 x), the activation of OpenAI CLIP and of the SLIP/DiffCLIP text tower."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016): drop the residual branch per sample with probability p."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)


class PatchEmbed(nn.Module):
    """Non-overlapping patches, Conv2d(kernel = stride = p): (B, C, H, W) → (B, N, D), N = (H/p)·(W/p)."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int, *, bias: bool = True):
        super().__init__()
        self.img_size, self.patch_size = img_size, patch_size
        self.grid_size = img_size // patch_size
        self.num_patches = self.grid_size**2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.proj.in_channels or tuple(x.shape[-2:]) != (self.img_size,) * 2:
            raise ValueError(f"images must have shape (B, {self.proj.in_channels}, {self.img_size}, "
                             f"{self.img_size}), got {tuple(x.shape)}")
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)


def build_mlp(dim: int, mlp: str, mlp_ratio: float, *, drop: float = 0.0, mlp_dropouts: int = 2) -> nn.Module:
    """The feed-forward block: ``"gelu"`` / ``"quick_gelu"`` (fc1 → act → fc2, hidden ⌊r·D⌋) or ``"swiglu"``
    (seed 004 §4.3: fused first projection of width ⌊r·D⌋ split into gate and up halves, hidden ⌊r·D/2⌋)."""
    if mlp not in MLP_TYPES:
        raise ValueError(f"mlp must be one of {MLP_TYPES}, got {mlp!r}")
    if not isinstance(mlp_ratio, (int, float)) or mlp_ratio <= 0:
        raise ValueError(f"mlp_ratio must be a positive number, got {mlp_ratio!r}")
    if mlp_dropouts not in (1, 2):
        raise ValueError(f"mlp_dropouts must be 1 or 2 (seed 004's dropout layouts), got {mlp_dropouts!r}")
    if mlp == "swiglu":
        return SwiGLU(dim, int(dim * mlp_ratio / 2), drop=drop if mlp_dropouts == 2 else 0.0, inner_drop=drop)
    if mlp_dropouts != 2 and drop > 0:
        raise ValueError(f"mlp_dropouts=1 is a SwiGLU layout (seed 004); mlp={mlp!r} has two dropouts")
    m = Mlp(dim, int(dim * mlp_ratio), drop=drop)
    if mlp == "quick_gelu":
        m.act = QuickGELU()
    return m


class Block(nn.Module):
    """Pre-norm transformer block with a switchable attention layer.

        x = x + drop_path(attn(norm1(x)));   x = x + drop_path(mlp(norm2(x)))

    ``depth`` is the 0-based index of the block (for ``lambda_init="ye"``); ``causal`` makes it a text block.
    """

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0, attention: str = "standard",
                 lambda_init: float | str = 0.8, mlp: str = "gelu", mlp_ratio: float = 4.0,
                 mlp_dropouts: int = 2, qkv_bias: bool = True, q_residual: bool = False, causal: bool = False,
                 norm_eps: float = 1e-6, drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 backend: str = "auto"):
        super().__init__()
        attn_kwargs = dict(depth=depth, lambda_init=lambda_init, qkv_bias=qkv_bias, causal=causal,
                           attn_drop=attn_drop, proj_drop=drop, backend=backend)
        if attention == "gated":
            attn_kwargs["q_residual"] = q_residual
        elif q_residual:
            raise ValueError(f"q_residual is the [Q⁺; Q⁻] residual of M-DGSA and needs attention='gated', "
                             f"got attention={attention!r}")
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = attention_class(attention)(dim, num_heads, **attn_kwargs)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = build_mlp(dim, mlp, mlp_ratio, drop=drop, mlp_dropouts=mlp_dropouts)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, need_weights: bool = False):
        """x: (B, N, D) → (B, N, D); with ``need_weights`` also the layer's AttentionWeights."""
        res = self.attn(self.norm1(x), attn_mask, need_weights)
        a, weights = res if need_weights else (res, None)
        x = x + self.drop_path1(a)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return (x, weights) if need_weights else x


def _check(name: str, ok: bool, got, need: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {need}, got {got!r}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class VisionTransformer(DiffattnModel):
    """ViT (Dosovitskiy et al. 2021) with ``attention="standard" | "diff" | "gated"``: ViT, DiffViT, DGViT.

    Pre-norm blocks, a CLS token and learned position embeddings; ``global_pool="token"`` classifies from the
    CLS token (seed 004 §4.3: DGViT "retains the learnable class token"), ``"avg"`` from the mean patch token.
    ``num_classes=0`` gives a feature extractor (the CLIP image tower). ``pre_norm`` adds OpenAI CLIP's
    ``ln_pre`` (here ``norm_pre``); ``patch_bias=False`` is OpenAI CLIP's bias-free patch convolution.
    See the module docstring for ``mlp``, ``mlp_ratio``, ``mlp_dropouts``, ``q_residual`` and ``lambda_init``.
    """

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 768, depth: int = 12, num_heads: int = 12, attention: str = "standard",
                 lambda_init: float | str = 0.8, mlp: str = "gelu", mlp_ratio: float = 4.0,
                 mlp_dropouts: int = 2, qkv_bias: bool = True, q_residual: bool = False,
                 class_token: bool = True, global_pool: str = "token", pre_norm: bool = False,
                 patch_bias: bool = True, norm_eps: float = 1e-6, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0, backend: str = "auto"):
        super().__init__()
        for name, v in (("img_size", img_size), ("patch_size", patch_size), ("in_chans", in_chans),
                        ("embed_dim", embed_dim), ("depth", depth), ("num_heads", num_heads)):
            _check(name, _is_int(v) and v >= 1, v, "an integer >= 1")
        _check("num_classes", _is_int(num_classes) and num_classes >= 0, num_classes, "an integer >= 0")
        _check("img_size", img_size % patch_size == 0, img_size, f"divisible by patch_size={patch_size}")
        _check("global_pool", global_pool in ("token", "avg"), global_pool, "'token' or 'avg'")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without it")
        attention_class(attention)  # validates the name
        resolve_lambda_init(lambda_init, 0)  # validates the value
        for name, p in (("drop_rate", drop_rate), ("attn_drop_rate", attn_drop_rate),
                        ("drop_path_rate", drop_path_rate)):
            _check(name, isinstance(p, (int, float)) and 0.0 <= p < 1.0, p, "a float in [0, 1)")
        self.num_classes, self.embed_dim, self.num_features = num_classes, embed_dim, embed_dim
        self.global_pool, self.attention = global_pool, attention
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim, bias=patch_bias)
        self.num_prefix_tokens = 1 if class_token else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        num_tokens = self.patch_embed.num_patches + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        self.norm_pre = nn.LayerNorm(embed_dim, eps=norm_eps) if pre_norm else nn.Identity()
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # linear stochastic-depth rule
        self.blocks = nn.ModuleList([
            Block(embed_dim, num_heads, depth=i, attention=attention, lambda_init=lambda_init, mlp=mlp,
                  mlp_ratio=mlp_ratio, mlp_dropouts=mlp_dropouts, qkv_bias=qkv_bias, q_residual=q_residual,
                  norm_eps=norm_eps, drop=drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[i],
                  backend=backend)
            for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's ViT init: truncated normal (std 0.02) for linear layers and the position embedding, zero
        biases; the λ vectors and sub-norms keep their own init (DESIGN.md §3.1)."""
        if self.pos_embed.device.type == "meta":
            return
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        w = self.patch_embed.proj.weight  # as a linear layer on flattened patches (timm)
        nn.init.trunc_normal_(w.view(w.shape[0], -1), std=math.sqrt(1.0 / w[0].numel()))

    def reset_classifier(self, num_classes: int) -> None:
        _check("num_classes", _is_int(num_classes) and num_classes >= 0, num_classes, "an integer >= 0")
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
        return self.norm_pre(self.pos_drop(x + self.pos_embed))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) → normalised tokens (B, 1 + N, D)."""
        x = self._embed(x)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """tokens (B, 1 + N, D) → logits (B, num_classes), or pooled features (B, D) with ``pre_logits``."""
        x = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens:].mean(dim=1)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) → logits (B, num_classes) (pooled features (B, D) when ``num_classes=0``)."""
        return self.forward_head(self.forward_features(x))

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor) -> list:
        """Per block :class:`~diffattn.functional.AttentionWeights` (A1, A2 and combined maps, each
        (B, heads, N, N)) for images x: rollout and attention-noise diagnostics."""
        x, maps = self._embed(x), []
        for blk in self.blocks:
            x, w = blk(x, need_weights=True)
            maps.append(w)
        return maps


# --------------------------------------------------------------------------------------------- registry

_SIZES = {
    # a CPU size: trains on 32×32 images in minutes
    "nano": dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=4, num_classes=10),
    # seed 004 App. B Table 4: width 256, 8 layers, 8 heads, patch 4, dropout 0.05 (CIFAR, 32×32)
    "cifar": dict(img_size=32, patch_size=4, embed_dim=256, depth=8, num_heads=8, num_classes=10,
                  drop_rate=0.05),
    "tiny_patch16_224": dict(embed_dim=192, depth=12, num_heads=3),
    "small_patch16_224": dict(embed_dim=384, depth=12, num_heads=6),
    "base_patch16_224": dict(embed_dim=768, depth=12, num_heads=12),
}
_DVIT = dict(attention="diff", mlp="swiglu", mlp_dropouts=2)  # seed 004 DViT
_DGVIT = dict(attention="gated", mlp="swiglu", mlp_dropouts=2, q_residual=True)  # seed 004 DGViT
_EXPANSIONS = {"x2": 2.0, "x4": 4.0, "x16_3": 16 / 3}
_CONFIGS: dict[str, dict] = {}
for _size in ("nano", "tiny_patch16_224", "small_patch16_224", "base_patch16_224"):
    _paired = {"num_heads": 6} if _size.startswith("tiny") else {}
    _CONFIGS[f"vit_{_size}"] = dict(_SIZES[_size])
    _CONFIGS[f"diff_vit_{_size}"] = {**_SIZES[_size], "attention": "diff", **_paired}
    _CONFIGS[f"dg_vit_{_size}"] = {**_SIZES[_size], **_DGVIT, "mlp_ratio": 4.0, **_paired}
_CONFIGS["vit_cifar"] = dict(_SIZES["cifar"])
for _tag, _r in _EXPANSIONS.items():  # seed 004's "8 heads" are differential heads: h = 16 here
    _CONFIGS[f"diff_vit_cifar_{_tag}"] = {**_SIZES["cifar"], **_DVIT, "num_heads": 16, "mlp_ratio": _r}
    _CONFIGS[f"dg_vit_cifar_{_tag}"] = {**_SIZES["cifar"], **_DGVIT, "num_heads": 16, "mlp_ratio": _r}

_VIT_ARGS = tuple(inspect.signature(VisionTransformer.__init__).parameters)[1:]


def vit_config(name: str) -> dict:
    """A copy of the registered configuration of vision model ``name``."""
    if name not in _CONFIGS:
        raise ValueError(f"name must be a registered vision model ({sorted(_CONFIGS)}), got {name!r}")
    return dict(_CONFIGS[name])


def _create(name: str, overrides: dict) -> VisionTransformer:
    if overrides.pop("pretrained", False):
        raise ValueError(f"pretrained=True: diffattn ships no weights for {name!r}; load yours with "
                         "diffattn.models.from_pretrained(dir) or a loader in diffattn.models.convert")
    for k in _TIMM_KWARGS:  # passed by timm.create_model; diffattn models have no pretrained configs
        overrides.pop(k, None)
    unknown = sorted(set(overrides) - set(_VIT_ARGS))
    if unknown:
        raise ValueError(f"overrides {unknown} are not arguments of VisionTransformer; "
                         f"it takes {list(_VIT_ARGS)}")
    return VisionTransformer(**{**_CONFIGS[name], **overrides})


for _name in _CONFIGS:
    globals()[_name] = register_builder(
        _name, lambda overrides, n=_name: _create(n, overrides),
        f"{_name}: VisionTransformer({', '.join(f'{k}={v!r}' for k, v in _CONFIGS[_name].items())}).", __name__)
    __all__.append(_name)


def _register_timm() -> list[str]:
    """Register each vision model with timm as ``diffattn_<name>`` and, where timm lacks it, as ``<name>``."""
    try:
        import timm
        from timm.models import register_model as timm_register
    except ImportError:  # timm is optional
        return []
    done = []
    for name in _CONFIGS:
        alias = f"diffattn_{name}"

        def entry(pretrained: bool = False, _name: str = name, **kwargs) -> VisionTransformer:
            model = model_builder(_name)(pretrained=pretrained, **kwargs)
            model.model_name = _name
            return model

        entry.__name__ = entry.__qualname__ = alias
        entry.__module__ = __name__
        entry.__doc__ = f"timm entry point of diffattn's {name!r}."
        globals()[alias] = entry  # timm lists it in this module's __all__; keep star-imports working
        if alias not in timm.list_models(alias):
            timm_register(entry)
            done.append(alias)
        if not timm.is_model(name):
            timm_register(globals()[name])
            done.append(name)
    return done


TIMM_NAMES = _register_timm()


del _size, _paired, _tag, _r, _name
