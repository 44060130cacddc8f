"""Vision transformers with a switchable attention: ViT, DiffViT (DViT) and DGViT.

    x (B, C, H, W) ─ patch_embed ─ [CLS; patches] + pos_embed ─ norm_pre ─ blocks ─ norm ─ pool ─ head
    block:  x = x + drop_path(attn(norm1(x)));   x = x + drop_path(mlp(norm2(x)))        (pre-norm)

One class, :class:`VisionTransformer`, serves every variant. ``attention`` (an
:class:`~diffattn.layers.AttentionSpec` or its dict, ``kind`` ``"standard" | "diff" | "gated"``) picks the layer;
everything else is shared
(:class:`diffattn.layers.Block`), so the state-dict keys outside ``blocks.*.attn`` are the same for all three (a
fair comparison). Parameter names follow timm (``patch_embed.proj``, ``cls_token``, ``pos_embed``,
``blocks.i.norm1``/``mlp.fc1``/``norm2``, ``norm``, ``head``) and the attention layers keep the names of DiffCLIP's
``DiffAttention`` module (``q_proj``… ``diff_norm``, ``lambda_q1``…; Hammoud & Ghanem 2025), which are also the
names of the DiffCLIP release's vision tower.

Registered models: the literal table :data:`VIT_CONFIGS` (``diffattn.models.create_model(name, **overrides)``):

- ``vit_nano``, ``vit_cifar``, ``vit_{tiny,small,base}_patch16_224``: standard attention, GELU MLP ×4
  (Dosovitskiy et al. 2021; ``vit_cifar`` is M-DGSA (2025)'s "ViTx4", App. B Tables 4 and 9).
- ``diff_vit_nano``, ``diff_vit_{tiny,small,base}_patch16_224``: the same with differential attention only
  (DiffCLIP's ``diff_vit_base_patch16_224``, Hammoud & Ghanem 2025 §4.1: every attention layer replaced).
- ``diff_vit_cifar_x{2,4,16_3}``: M-DGSA (2025)'s DViT, differential attention + SwiGLU ×2/×4/×16/3, 2 dropouts.
- ``dg_vit_cifar_x{2,4,16_3}``, ``dg_vit_nano``, ``dg_vit_{tiny,small,base}_patch16_224``: M-DGSA (2025)'s DGViT
  (§4.3): M-DGSA with the [Q⁺; Q⁻] residual and a SwiGLU FFN (×4 unless the name says otherwise).

Conventions and choices (say them, never guess):
- ``num_heads`` is the standard head count h (docs/design.md); differential layers have h/2 heads. M-DGSA (2025)
  counts *differential* heads: its "8 heads" at width 256 are h = 16 here (head width d = 16). Its App. B.4
  Table 9 implies it: DGViTx4 − DViTx4 = 8 layers × (256·8 + 8 gate weights − 4·16 λ values) = 15,936.
- ViT-Ti has 3 standard heads, which cannot pair; ``diff_vit_tiny*`` and ``dg_vit_tiny*`` use h = 6
  (3 differential heads whose value width 64 equals the baseline's head width).
- SwiGLU expansion r (×2, ×4, ×16/3) is the width of the fused first projection (:func:`diffattn.layers.build_mlp`).
  ``mlp_ratio`` is r for ``mlp="swiglu"`` and the hidden width ratio for the GELU MLPs.
- Dropout layouts (M-DGSA 2025, Table 1, "one or two dropout layers"): ``mlp_dropouts=1`` puts one dropout between
  the activation and the down projection; ``mlp_dropouts=2`` adds one after the down projection (as timm).
  ``drop_rate`` is also used after the position embedding; the attention output projection's is the spec's
  ``proj_drop`` (the M-DGSA tables set it to ``drop_rate``).
- the spec's ``lambda_init``: a float (0.8, DiffCLIP and M-DGSA 2025, App. B.5) or ``"ye"``: 0.8 − 0.6·exp(−0.3·l)
  with l
  the **0-based** block index (block 0 gets 0.2; Ye et al. 2024 §2.1).
- its ``lambda_form`` and ``sub_norm``: the differential layers' λ form (:mod:`diffattn.lambdas`) and their per-head
  sub-norm (None: each layer's default; the sub-norm is on for every λ form but ``token_sigmoid``).

timm: :func:`diffattn.factory.register_timm` puts each vision model in timm's registry as ``diffattn_<name>``, and
under its own name where timm has no model of that name (``diff_vit_*``, ``dg_vit_*``, ``vit_nano``, ``vit_cifar``;
timm's own ``vit_*_patch16_224`` are never overridden). Importing diffattn registers nothing: call it before asking
timm for a diffattn name (``diffattn timm-train`` does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from ..layers import AttentionSpec, Block, LooseAttention, PatchEmbed
from ..layers.blocks import STANDARD
from .base import DiffattnModel
from .config import check_args, check_choice, check_size, is_int
from .registry import ModelFamily, register_family

__all__ = ["VisionTransformer", "VIT_CONFIGS", "IMAGENET_MEAN", "IMAGENET_STD", "take_indices", "feature_extractor",
           "FEATURE_KWARGS"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def take_indices(num_blocks: int, indices: int | Sequence[int] | None) -> tuple[list[int], int]:
    """(sorted absolute block indices, the largest) for timm's ``indices`` argument: None → every block, an int n →
    the last n blocks, a sequence → those blocks (negative indices count from the end)."""
    if indices is None:
        indices = num_blocks
    if is_int(indices):
        if not 1 <= indices <= num_blocks:
            raise ValueError(f"indices as an int is a count of last blocks and must be in [1, {num_blocks}], "
                             f"got {indices}")
        take = list(range(num_blocks - indices, num_blocks))
    elif isinstance(indices, Sequence) and not isinstance(indices, str) and len(indices) and all(
            is_int(i) for i in indices):
        take = []
        for i in indices:
            if not -num_blocks <= i < num_blocks:
                raise ValueError(f"indices must be block indices in [-{num_blocks}, {num_blocks}), got {list(indices)}")
            take.append(i % num_blocks)
        take = sorted(set(take))
    else:
        raise ValueError(f"indices must be None, an int or a non-empty sequence of ints, got {indices!r}")
    return take, take[-1]


class VisionTransformer(DiffattnModel):
    """ViT (Dosovitskiy et al. 2021) with attention of kind ``"standard" | "diff" | "gated"``: ViT, DiffViT, DGViT.

    Pre-norm blocks, a CLS token and learned position embeddings; ``global_pool="token"`` classifies from the
    CLS token (M-DGSA 2025, §4.3: DGViT "retains the learnable class token"), ``"avg"`` from the mean patch token.
    ``num_classes=0`` gives a feature extractor (the CLIP image tower). ``pre_norm`` adds OpenAI CLIP's
    ``ln_pre`` (here ``norm_pre``); ``patch_bias=False`` is OpenAI CLIP's bias-free patch convolution.
    See the module docstring for ``mlp``, ``mlp_ratio``, ``mlp_dropouts`` and the attention settings.
    ``attention`` is an :class:`~diffattn.layers.AttentionSpec` or its dict: every attention setting in one value.
    ``drop_rate`` is the dropout after the position embedding and in the MLP (the attention's are the spec's). The
    loose keywords of before (:data:`LOOSE`) are deprecated (:class:`~diffattn.layers.LooseAttention`).
    """

    #: the spelling of before: ``attention="diff", lambda_init=…``, where ``drop_rate`` was ``proj_drop`` too
    LOOSE = LooseAttention("VisionTransformer", ("lambda_init", "lambda_form", "sub_norm", "qkv_bias", "q_residual",
                                                 "attn_drop_rate", "backend"), fill={"proj_drop": "drop_rate"})

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 768, depth: int = 12, num_heads: int = 12,
                 attention: AttentionSpec | Mapping = STANDARD, mlp: str = "gelu", mlp_ratio: float = 4.0,
                 mlp_dropouts: int = 2, class_token: bool = True, global_pool: str = "token", pre_norm: bool = False,
                 patch_bias: bool = True, norm_eps: float = 1e-6, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, **loose):
        super().__init__()
        check_args("VisionTransformer", img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                   num_classes=num_classes, embed_dim=embed_dim, depth=depth, num_heads=num_heads,
                   norm_eps=norm_eps, drop_rate=drop_rate, drop_path_rate=drop_path_rate)
        if img_size % patch_size:
            raise ValueError(f"img_size must be divisible by patch_size={patch_size}, got {img_size!r}")
        check_choice("global_pool", global_pool, ("token", "avg"))
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without it")
        spec = self.LOOSE.resolve(attention, loose, {"drop_rate": drop_rate})
        self.num_classes, self.embed_dim, self.num_features = num_classes, embed_dim, embed_dim
        self.global_pool, self.attention, self.attention_spec = global_pool, spec.kind, spec
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim, bias=patch_bias)
        self.num_prefix_tokens = 1 if class_token else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        num_tokens = self.patch_embed.num_patches + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        self.norm_pre = nn.LayerNorm(embed_dim, eps=norm_eps) if pre_norm else nn.Identity()
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # linear stochastic-depth rule
        self.blocks = nn.ModuleList([
            Block(embed_dim, num_heads, depth=i, attention=spec, mlp=mlp, mlp_ratio=mlp_ratio,
                  mlp_dropouts=mlp_dropouts, norm_eps=norm_eps, drop=drop_rate, drop_path=dpr[i])
            for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.grad_checkpointing = False
        self.pretrained_overlay: dict = {}  # pretrained_cfg entries of loaded weights (diffattn.models.pretrained)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's ViT init: truncated normal (std 0.02) for linear layers and the position embedding, zero
        biases; the λ vectors and sub-norms keep their own init (docs/design.md)."""
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

    # ------------------------------------------------------------- timm's model API (timm.models.VisionTransformer)

    @property
    def pretrained_cfg(self) -> dict:
        """timm's data config of this model (``timm.data.resolve_data_config(model=model)`` reads it): input size,
        bicubic interpolation, crop fraction and normalisation. The normalisation is timm's ImageNet default (the
        statistics timm's ViTs are trained with; their channel mean for ``in_chans != 3``); diffattn's own
        classifier recipes standardise by the train split's statistics instead
        (:func:`diffattn.data.transforms.pixel_stats`): pass ``--mean``/``--std`` to timm's scripts for those.
        Weights loaded with ``pretrained=TAG`` put their own preprocessing (and tag) in ``pretrained_overlay``."""
        c, size = self.patch_embed.proj.in_channels, self.patch_embed.img_size
        mean, std = IMAGENET_MEAN, IMAGENET_STD
        if c != 3:
            mean, std = (sum(mean) / 3,) * c, (sum(std) / 3,) * c
        cfg = {"architecture": self.model_name, "input_size": (c, size, size), "interpolation": "bicubic",
               "crop_pct": 0.9 if size >= 224 else 1.0, "crop_mode": "center", "mean": mean, "std": std,
               "num_classes": self.num_classes, "first_conv": "patch_embed.proj", "classifier": "head"}
        return {**cfg, **self.pretrained_overlay}

    @property
    def default_cfg(self) -> dict:
        """timm's older name of :attr:`pretrained_cfg`."""
        return self.pretrained_cfg

    @property
    def feature_info(self) -> list[dict]:
        """One entry per block, as timm's ViT: its module name, channels (the width) and reduction (the patch
        size); what ``timm.create_model(name, features_only=True)`` reports."""
        r = self.patch_embed.patch_size
        return [{"module": f"blocks.{i}", "num_chs": self.embed_dim, "reduction": r} for i in range(len(self.blocks))]

    def get_classifier(self) -> nn.Module:
        """The classification head (``nn.Identity`` when ``num_classes=0``)."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new head for ``num_classes`` classes (0: no head, the pooled features are the output), on the device
        and in the dtype of the model; ``global_pool`` (``"token"`` or ``"avg"``) changes the pooling too."""
        check_size("num_classes", num_classes, owner="reset_classifier")
        if global_pool is not None:
            check_choice("global_pool", global_pool, ("token", "avg"), owner="reset_classifier")
            if global_pool == "token" and self.cls_token is None:
                raise ValueError("reset_classifier: global_pool='token' needs a class token; this model has none "
                                 "(class_token=False), use global_pool='avg'")
            self.global_pool = global_pool
        ref = self.norm.weight if isinstance(self.norm, nn.LayerNorm) else self.pos_embed
        self.num_classes = num_classes
        self.head = (nn.Linear(self.embed_dim, num_classes, device=ref.device, dtype=ref.dtype)
                     if num_classes > 0 else nn.Identity())

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass (``torch.utils.checkpoint``, non-reentrant)
        instead of storing them: less memory, the same gradients. timm's ``--grad-checkpointing`` calls this."""
        if not isinstance(enable, bool):
            raise TypeError(f"enable must be a bool, got {type(enable).__name__}")
        self.grad_checkpointing = enable

    def no_weight_decay(self) -> set[str]:
        """Parameters timm's optimizer factory keeps out of weight decay: ``pos_embed``, ``cls_token`` and every λ
        parameter of the differential layers (λ weighs the second attention map, Ye et al. 2024 §2.1; decay would
        pull it towards 0, i.e. towards standard attention)."""
        names = {"pos_embed"} | ({"cls_token"} if self.cls_token is not None else set())
        return names | {n for n, _ in self.named_parameters() if n.rsplit(".", 1)[-1].startswith("lambda")}

    def group_matcher(self, coarse: bool = False) -> dict:
        """Regexes that group the parameters as timm's ViT does: ``stem`` (tokens, position and patch embedding,
        ``norm_pre``), one group per block, the final ``norm`` last; the head falls in the last group. timm's
        ``param_groups_layer_decay`` (``create_optimizer_v2(model, layer_decay=...)``) scales learning rates by it.
        ``coarse`` gives the same groups (as timm's ViT)."""
        return {"stem": r"^cls_token|pos_embed|patch_embed|norm_pre",
                "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]}

    def _run_block(self, blk: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(blk, x, use_reentrant=False)
        return blk(x)

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
        return self.norm_pre(self.pos_drop(x + self.pos_embed))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) → normalised tokens (B, 1 + N, D)."""
        x = self._embed(x)
        for blk in self.blocks:
            x = self._run_block(blk, x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """tokens (B, 1 + N, D) → logits (B, num_classes), or pooled features (B, D) with ``pre_logits``."""
        x = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens:].mean(dim=1)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) → logits (B, num_classes) (pooled features (B, D) when ``num_classes=0``)."""
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None, *,
                              return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False):
        """The outputs of chosen blocks, as timm's ``VisionTransformer.forward_intermediates``.

        ``indices``: None (every block), an int n (the last n blocks) or block indices (negative ones count from
        the end). ``norm`` applies the final norm to each; ``output_fmt="NCHW"`` gives (B, D, H/p, W/p) maps,
        ``"NLC"`` (B, N, D) patch tokens; ``return_prefix_tokens`` pairs each with its (B, 1, D) CLS token.
        ``stop_early`` skips the blocks after the last one asked for. Returns the list, or (final normalised
        tokens (B, 1 + N, D), list) unless ``intermediates_only``.
        """
        check_choice("output_fmt", output_fmt, ("NCHW", "NLC"), owner="forward_intermediates")
        take, last = take_indices(len(self.blocks), indices)
        B, _, H, W = x.shape
        x = self._embed(x)
        blocks = self.blocks[:last + 1] if stop_early or intermediates_only else self.blocks
        out = []
        for i, blk in enumerate(blocks):
            x = self._run_block(blk, x)
            if i in take:
                out.append(self.norm(x) if norm else x)
        p = self.num_prefix_tokens
        prefix = [y[:, :p] for y in out]  # (B, 1, D) each
        out = [y[:, p:] for y in out]  # (B, N, D)
        if output_fmt == "NCHW":
            h, w = H // self.patch_embed.patch_size, W // self.patch_embed.patch_size
            out = [y.reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous() for y in out]  # (B, D, h, w)
        if return_prefix_tokens and p:
            out = list(zip(out, prefix, strict=True))
        if intermediates_only:
            return out
        return self.norm(x), out

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the blocks after the last of ``indices`` (and the final norm / the head when asked); returns the
        absolute indices, as timm's ViT. ``features_only=True`` calls it so that unused blocks cost nothing."""
        take, last = take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:last + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0)
        return take

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

_X16_3 = 16 / 3  # M-DGSA (2025)'s ×16/3 SwiGLU expansion
_DIFF = dict(kind="diff")
_DG = dict(kind="gated", q_residual=True)  # M-DGSA with the [Q⁺; Q⁻] residual (DGViT)
_CIFAR = dict(img_size=32, patch_size=4, embed_dim=256, depth=8, num_heads=16, num_classes=10, drop_rate=0.05,
              mlp="swiglu", mlp_dropouts=2)  # the DViT / DGViT sizes of M-DGSA (2025) App. B Table 4
VIT_CONFIGS: dict[str, dict] = {
    # a CPU size: trains on 32×32 images in minutes
    "vit_nano": dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=4, num_classes=10),
    "diff_vit_nano": dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=4, num_classes=10,
                          attention=_DIFF),
    "dg_vit_nano": dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=4, num_classes=10,
                        attention=_DG, mlp="swiglu", mlp_dropouts=2, mlp_ratio=4.0),
    # ImageNet sizes (timm's ViT-Ti/S/B 16 × 224); ViT-Ti's 3 heads cannot pair, its differential towers use 6
    "vit_tiny_patch16_224": dict(embed_dim=192, depth=12, num_heads=3),
    "diff_vit_tiny_patch16_224": dict(embed_dim=192, depth=12, num_heads=6, attention=_DIFF),
    "dg_vit_tiny_patch16_224": dict(embed_dim=192, depth=12, num_heads=6, attention=_DG, mlp="swiglu",
                                    mlp_dropouts=2, mlp_ratio=4.0),
    "vit_small_patch16_224": dict(embed_dim=384, depth=12, num_heads=6),
    "diff_vit_small_patch16_224": dict(embed_dim=384, depth=12, num_heads=6, attention=_DIFF),
    "dg_vit_small_patch16_224": dict(embed_dim=384, depth=12, num_heads=6, attention=_DG, mlp="swiglu",
                                     mlp_dropouts=2, mlp_ratio=4.0),
    "vit_base_patch16_224": dict(embed_dim=768, depth=12, num_heads=12),
    "diff_vit_base_patch16_224": dict(embed_dim=768, depth=12, num_heads=12, attention=_DIFF),
    "dg_vit_base_patch16_224": dict(embed_dim=768, depth=12, num_heads=12, attention=_DG, mlp="swiglu",
                                    mlp_dropouts=2, mlp_ratio=4.0),
    # M-DGSA (2025) App. B Table 4: width 256, 8 layers, "8 heads" (differential: h = 16), patch 4, dropout 0.05 (also
    # on the attention output)
    "vit_cifar": dict(img_size=32, patch_size=4, embed_dim=256, depth=8, num_heads=8, num_classes=10,
                      drop_rate=0.05, attention=dict(kind="standard", proj_drop=0.05)),
    "diff_vit_cifar_x2": dict(_CIFAR, attention=dict(_DIFF, proj_drop=0.05), mlp_ratio=2.0),
    "dg_vit_cifar_x2": dict(_CIFAR, attention=dict(_DG, proj_drop=0.05), mlp_ratio=2.0),
    "diff_vit_cifar_x4": dict(_CIFAR, attention=dict(_DIFF, proj_drop=0.05), mlp_ratio=4.0),
    "dg_vit_cifar_x4": dict(_CIFAR, attention=dict(_DG, proj_drop=0.05), mlp_ratio=4.0),
    "diff_vit_cifar_x16_3": dict(_CIFAR, attention=dict(_DIFF, proj_drop=0.05), mlp_ratio=_X16_3),
    "dg_vit_cifar_x16_3": dict(_CIFAR, attention=dict(_DG, proj_drop=0.05), mlp_ratio=_X16_3),
}

FEATURE_KWARGS = ("out_indices", "output_fmt", "feature_cls", "feature_cfg")


def feature_extractor(model: VisionTransformer, out_indices: int | Sequence[int] = 3, output_fmt: str = "NCHW",
                      feature_cls: str = "getter", feature_cfg: dict | None = None) -> nn.Module:
    """``model`` as timm's ``FeatureGetterNet``: ``forward(images)`` → the list of block features, with
    ``feature_info`` (channels, reduction, module per output). ``out_indices``: the last 3 blocks unless given (as
    timm's ViT); ``output_fmt`` "NCHW" or "NLC"; ``feature_cfg={"norm": True}`` applies the final norm. The blocks
    after the last index are pruned. What ``create_model(name, features_only=True)`` (diffattn's or timm's) builds."""
    if not hasattr(model, "forward_intermediates"):
        raise ValueError(f"features_only=True needs a vision transformer, got {type(model).__name__}")
    check_choice("feature_cls", feature_cls, ("getter",), owner="features_only")
    try:
        from timm.models._features import FeatureGetterNet
    except ImportError as e:
        raise ImportError("features_only=True wraps the model in timm's FeatureGetterNet: pip install timm") from e
    cfg = dict(feature_cfg or {})
    return FeatureGetterNet(model, out_indices=out_indices, output_fmt=output_fmt, norm=bool(cfg.get("norm", False)))


register_family(ModelFamily(VisionTransformer, VIT_CONFIGS, __name__, "vision transformer",
                            features=feature_extractor, feature_kwargs=FEATURE_KWARGS))
