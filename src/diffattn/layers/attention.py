"""Attention layers with one constructor and forward interface: standard, differential, gated differential and
Diff Transformer V2.

A model switches attention by name (:func:`attention_class`) and gets a fair comparison: same projections, same
rotary embedding and KV cache, same masks.

    x ─ q_proj/k_proj/v_proj ─ (RoPE) ─ (KV cache) ─ attend ─ concat heads ─ out_proj ─ dropout

:class:`DiffAttention` follows DiffCLIP's module (Hammoud et al. 2025) for names and layout: ``num_heads`` is the
standard head count h (even), H = h/2 differential heads, head width d = dim/h, Q and K viewed as 2H heads of width d,
V as H heads of width 2d, differential head i pairing Q/K heads 2i and 2i+1 ("adjacent" layout). Every
differential layer holds its λ form (:mod:`diffattn.lambdas`) as the submodule ``lambda_fn``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..functional import (
    BACKENDS,
    AttentionWeights,
    _compute_dtype,
    _diff_attention_pairs,
    _takes_triton,
    attention,
    restrict_mask,
    sliding_window_mask,
)
from ..lambdas import DEFAULT_LAMBDA_INIT, build_lambda, resolve_lambda_init
from .kv_cache import KVCache
from .norm import RMSNorm, head_rms_norm, scaled_rms_norm
from .rope import ROPE_STYLES, RotaryEmbedding, apply_rotary

__all__ = ["Attention", "DiffAttention", "GatedDiffAttention", "DiffAttentionV2", "ATTENTION_TYPES",
           "attention_class", "attention_kind"]


def _check_int(name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


class _AttentionBase(nn.Module):
    """Projections, rotary embedding, KV cache and output path shared by the layers.

    q_proj: dim → q_heads·d, k_proj: dim → num_kv_heads·d, v_proj: dim → num_kv_heads·d (viewed as heads of width
    ``v_head_dim``), out_proj: num_heads·d → dim, with d = dim / num_heads unless ``head_dim`` is given.
    """

    def _setup(self, dim, num_heads, num_kv_heads, qkv_bias, out_bias, causal, attn_drop, proj_drop, backend,
               rope, rope_theta, *, paired: bool, q_heads_per_head: int = 1, v_head_mult: int = 1,
               softcap: float | None = None, sliding_window: int | None = None, head_dim: int | None = None) -> None:
        _check_int("dim", dim)
        _check_int("num_heads", num_heads)
        if head_dim is not None:
            _check_int("head_dim", head_dim)
        elif dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        if paired and num_heads % 2:
            raise ValueError(f"num_heads is the standard head count and must be even for differential attention "
                             f"(H = num_heads/2 differential heads), got {num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}")
        if paired and num_kv_heads % 2:
            raise ValueError(f"num_kv_heads must be even for differential attention, got {num_kv_heads}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if rope is not None and rope not in ROPE_STYLES:
            raise ValueError(f"rope must be None or one of {ROPE_STYLES}, got {rope!r}")
        for name, p in (("attn_drop", attn_drop), ("proj_drop", proj_drop)):
            if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be a float in [0, 1), got {p!r}")
        if softcap is not None and not (isinstance(softcap, (int, float)) and 0 < softcap < float("inf")):
            raise ValueError(f"softcap must be None or a finite float > 0, got {softcap!r}")
        if sliding_window is not None:
            _check_int("sliding_window", sliding_window)
        if not isinstance(causal, bool):
            raise ValueError(f"causal must be a bool, got {causal!r}")
        self.dim, self.num_heads, self.num_kv_heads = dim, num_heads, num_kv_heads
        self.head_dim = dim // num_heads if head_dim is None else head_dim
        self.inner_dim = num_heads * self.head_dim  # width of the concatenated heads, out_proj's input
        self.causal, self.backend, self.attn_drop = causal, backend, attn_drop
        self.softcap, self.sliding_window = softcap, sliding_window
        self.scale = self.head_dim**-0.5
        self.q_heads = q_heads_per_head * num_heads  # heads of width head_dim in q_proj's output
        self.v_head_dim = v_head_mult * self.head_dim  # width of one value head
        self.v_heads = num_kv_heads // v_head_mult
        self.q_proj = nn.Linear(dim, self.q_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(dim, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(dim, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(self.inner_dim, dim, bias=out_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        self.rotary = RotaryEmbedding(self.head_dim, base=rope_theta, style=rope) if rope is not None else None

    def _project(self, x, position_ids, kv_cache):
        B, N, _ = x.shape
        d = self.head_dim
        q_lin = self.q_proj(x)  # (B, N, q_heads·d)
        q = q_lin.view(B, N, self.q_heads, d).transpose(1, 2)  # (B, q_heads, N, d)
        k = self.k_proj(x).view(B, N, self.num_kv_heads, d).transpose(1, 2)  # (B, kv_heads, N, d)
        v = self.v_proj(x).view(B, N, self.v_heads, self.v_head_dim).transpose(1, 2)  # (B, v_heads, N, dv)
        if self.rotary is not None:
            if position_ids is None:
                start = kv_cache.length if kv_cache is not None else 0
                position_ids = torch.arange(start, start + N, device=x.device)
            cos, sin = self.rotary(position_ids, dtype=_compute_dtype(q.dtype))
            q = apply_rotary(q, cos, sin, self.rotary.style)
            k = apply_rotary(k, cos, sin, self.rotary.style)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        return q, k, v, q_lin

    def _check_x(self, x):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"x must be a tensor of shape (B, N, dim={self.dim}), got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, N, dim={self.dim}), got {tuple(x.shape)}")
        w = self.q_proj.weight
        if x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(f"x has dtype {x.dtype} but the layer's weights are {w.dtype}; cast x or the layer "
                             f"(layer.to({x.dtype})) so they match, or run under torch.autocast")
        if x.device != w.device:
            raise ValueError(f"x is on {x.device} but the layer's weights are on {w.device}")

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        *,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        is_causal: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, AttentionWeights]:
        """x: (B, N, dim) → (B, N, dim).

        attn_mask: bool (True = attend) or additive float, broadcastable to (B, heads, N, Nk), where heads is the
            layer's attention-head count (num_heads for :class:`Attention` and :class:`DiffAttentionV2`,
            num_heads/2 for :class:`DiffAttention`).
        need_weights: also return :class:`~diffattn.functional.AttentionWeights` (A1, A2, combined; for standard
            attention A1 = combined = A and A2 is None), the maps before attention dropout. They are computed on
            the side, by the ``math`` backend from the same q, k and λ: the output is the one the layer gives
            without ``need_weights``, bit for bit (the fused and SDPA kernels sum in another order than math).
        position_ids: (N,) or (B, N) positions for the rotary embedding; default continues ``kv_cache``.
        kv_cache: a :class:`KVCache` to append to and attend over (incremental decoding).
        is_causal: overrides the layer's ``causal`` flag; the causal mask is aligned to the end of the cache.
        """
        self._check_x(x)
        B, N, _ = x.shape
        q, k, v, q_lin = self._project(x, position_ids, kv_cache)
        causal = self.causal if is_causal is None else is_causal
        if self.sliding_window is not None:
            attn_mask = restrict_mask(attn_mask, sliding_window_mask(N, k.shape[2], self.sliding_window, x.device))
        drop = self.attn_drop if self.training else 0.0
        out, _ = self._attend(x, q, k, v, attn_mask, causal, drop, False)  # (B, heads, N, dv)
        # the maps on the side (no dropout, so no random numbers drawn): the output keeps its own path
        weights = self._attend(x, q, k, v, attn_mask, causal, 0.0, True)[1] if need_weights else None
        out = out.transpose(1, 2).reshape(B, N, self.inner_dim)
        out = self._output(out, q_lin)
        return (out, weights) if need_weights else out

    def _output(self, out, q_lin):
        return self.proj_drop(self.out_proj(out))

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):  # pragma: no cover - abstract
        raise NotImplementedError


class Attention(_AttentionBase):
    """Standard multi-head attention (Vaswani et al. 2017): the baseline, through PyTorch's SDPA kernels.

    O_i = softmax(Q_i K_iᵀ / √d) V_i per head, concat, ``out_proj``. Takes the differential layers' constructor
    arguments (``depth``, ``lambda_init``, ``lambda_form``, ``lambda_options``, ``sub_norm*``) so models switch
    attention by name; they are unused.
    """

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0, lambda_init: float | str = DEFAULT_LAMBDA_INIT,
                 lambda_form: str = "reparam", lambda_options: dict | None = None, num_kv_heads: int | None = None,
                 qkv_bias: bool = True, out_bias: bool = True, causal: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, backend: str = "auto", rope: str | None = None, rope_theta: float = 10000.0,
                 sub_norm: bool | None = None, sub_norm_eps: float = 1e-5, sub_norm_affine: bool = True,
                 softcap: float | None = None, sliding_window: int | None = None):
        super().__init__()
        if backend == "triton":
            raise ValueError("backend='triton' is for differential attention; Attention takes 'auto', 'math' "
                             "or 'sdpa'")
        self._setup(dim, num_heads, num_kv_heads, qkv_bias, out_bias, causal, attn_drop, proj_drop, backend,
                    rope, rope_theta, paired=False, softcap=softcap, sliding_window=sliding_window)
        self.depth = depth

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):
        res = attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=self.scale, dropout_p=drop,
                        softcap=self.softcap, backend=self.backend, return_weights=need_weights)
        if need_weights:
            out, a = res
            return out, AttentionWeights(a, None, a)
        return res, None


# Names the λ parameters had directly on the attention module before λ forms became submodules (DiffCLIP's
# ``lambda_q1`` …, M-DGSA's ``gate_proj``): checkpoints keep them.
_FLAT_LAMBDA_NAMES = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "gate_proj.weight", "gate_proj.bias")


class _DiffBase(_AttentionBase):
    """λ form as ``lambda_fn``, the optional per-head sub-norm, and the state-dict names of the λ parameters."""

    def _setup_lambda(self, *, dim, depth, lambda_init, lambda_form, lambda_options, heads, norm_width,
                      sub_norm, sub_norm_eps, sub_norm_affine, out_scale: bool) -> None:
        if lambda_options is not None and not isinstance(lambda_options, dict):
            raise ValueError(f"lambda_options must be a dict or None, got {type(lambda_options).__name__}")
        if sub_norm is not None and not isinstance(sub_norm, bool):
            raise ValueError(f"sub_norm must be a bool or None (the λ form's default), got {sub_norm!r}")
        self.depth = depth
        self.lambda_init = resolve_lambda_init(lambda_init, depth)
        self.lambda_form = lambda_form
        self.lambda_fn = build_lambda(lambda_form, dim=dim, num_heads=heads, head_dim=self.head_dim,
                                      lambda_init=self.lambda_init, **(lambda_options or {}))
        if sub_norm is None:
            sub_norm = bool(type(self.lambda_fn).sub_norm)  # off for token_sigmoid (Diff Transformer V2)
        if sub_norm:
            if not (isinstance(sub_norm_eps, (int, float)) and 0 < sub_norm_eps < float("inf")):
                raise ValueError(f"sub_norm_eps must be a finite float > 0, got {sub_norm_eps!r}")
            self.diff_norm = head_rms_norm(norm_width, eps=float(sub_norm_eps), affine=bool(sub_norm_affine))
        else:
            self.diff_norm = nn.Identity()
        self.out_scale = (1.0 - self.lambda_init) if (sub_norm and out_scale) else 1.0
        self.register_state_dict_post_hook(_flatten_lambda_names)
        self.register_load_state_dict_pre_hook(_nest_lambda_names)
        self.register_load_state_dict_post_hook(_report_flat_names)

    # the old attribute names, read from the λ form
    @property
    def lambda_q1(self) -> nn.Parameter:
        return self.lambda_fn.lambda_q1

    @property
    def lambda_k1(self) -> nn.Parameter:
        return self.lambda_fn.lambda_k1

    @property
    def lambda_q2(self) -> nn.Parameter:
        return self.lambda_fn.lambda_q2

    @property
    def lambda_k2(self) -> nn.Parameter:
        return self.lambda_fn.lambda_k2

    @property
    def gate_proj(self) -> nn.Linear:
        return self.lambda_fn.gate_proj

    def lambda_weights(self, x: torch.Tensor) -> tuple[float | torch.Tensor, float | torch.Tensor]:
        """(weight1, λ) for input x (B, N, dim), each a float or a tensor broadcastable to (B, H, N, 1)."""
        return self.lambda_fn(x)

    def _fused(self, x, q, k, v, attn_mask, causal, drop, need_weights, k_paired: bool) -> torch.Tensor | None:
        """The whole differential part of the layer in the fused kernels, where the operator would run them:
        λ from its parameters or logits, (w1 A1 − λ A2) V and the sub-norm × (1 − λ_init) in one autograd node,
        written in the layer's output layout (:func:`diffattn.kernels.triton_diff.fused_layer_attention`).
        None where that path does not apply; the layer then takes the general one (same numbers)."""
        if need_weights or drop > 0.0 or self.softcap is not None or self.backend not in ("auto", "triton"):
            return None
        if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            return None  # compiled graphs fuse the λ and norm ops themselves around the kernel's operator
        q1, q2 = q[:, 0::2], q[:, 1::2]
        k1, k2 = (k[:, 0::2], k[:, 1::2]) if k_paired else (k, k)
        if not _takes_triton(q1, k1, q2, k2, v, attn_mask, causal, drop, self.backend, self.scale):
            return None
        form = self.lambda_fn.kernel_inputs(x)
        if form is None:
            return None
        mode, lam_inputs, lam_init = form
        norm = self.diff_norm
        if isinstance(norm, RMSNorm):
            width, weight = norm.normalized_shape[-1], norm.weight
            eps = norm.eps if norm.eps is not None else torch.finfo(v.dtype).eps
        elif isinstance(norm, nn.Identity):
            width, weight, eps = None, None, 1e-5
        else:
            return None
        from ..kernels.triton_diff import fused_layer_attention, fused_layer_reason

        if fused_layer_reason(q, k, v, k_paired=k_paired, lambda_mode=mode, lambda_inputs=lam_inputs,
                              norm_weight=weight, norm_width=width, attn_mask=attn_mask, is_causal=causal,
                              operator_checked=True):  # _takes_triton ran the kernel's own checks
            return None
        return fused_layer_attention(q, k, v, k_paired=k_paired, lambda_mode=mode, lambda_inputs=lam_inputs,
                                     lambda_init=lam_init, norm_width=width, norm_weight=weight,
                                     norm_scale=self.out_scale, norm_eps=eps, attn_mask=attn_mask,
                                     is_causal=causal, scale=self.scale)


def _flat_names(module: _DiffBase) -> set[str]:
    own = {n for n, _ in module.lambda_fn.named_parameters()} | {n for n, _ in module.lambda_fn.named_buffers()}
    return own & set(_FLAT_LAMBDA_NAMES)


def _flatten_lambda_names(module, state_dict, prefix, local_metadata) -> None:
    """state_dict hook: ``lambda_fn.lambda_q1`` → ``lambda_q1`` (and ``gate_proj.*``), the names checkpoints use."""
    for name in _flat_names(module):
        key = f"{prefix}lambda_fn.{name}"
        if key in state_dict:
            state_dict[prefix + name] = state_dict.pop(key)


def _nest_lambda_names(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                       error_msgs) -> None:
    """load_state_dict pre-hook: the flat checkpoint names back into ``lambda_fn``; a strict load of a state dict
    with the λ bias of diffattn 0.1.0's ``token_sigmoid`` into a layer without it also says how to load it."""
    for name in _flat_names(module):
        if prefix + name in state_dict:
            state_dict[f"{prefix}lambda_fn.{name}"] = state_dict.pop(prefix + name)
    proj = getattr(module.lambda_fn, "lambda_proj", None)
    if strict and isinstance(proj, nn.Linear) and proj.bias is None and f"{prefix}lambda_fn.lambda_proj.bias" in \
            state_dict:
        error_msgs.append(f"{prefix}lambda_fn.lambda_proj.bias is the bias of diffattn 0.1.0's token_sigmoid λ, "
                          f"σ(X W + b); build the layer with lambda_options={{'bias': True}}, or load the state dict "
                          f"with diffattn.layers.load_layer(..., diffattn_format=0), which does so")


def _report_flat_names(module, incompatible_keys) -> None:
    """load_state_dict post-hook: missing λ parameters are named as a checkpoint names them (``…lambda_q1``)."""
    for i, key in enumerate(incompatible_keys.missing_keys):
        head, sep, name = key.rpartition("lambda_fn.")
        if sep and name in _FLAT_LAMBDA_NAMES:
            incompatible_keys.missing_keys[i] = head + name


class DiffAttention(_DiffBase):
    """Differential attention (Ye et al. 2024 §2.1; DiffCLIP, Hammoud et al. 2025 §3.1).

        [Q1_i; Q2_i] = Q heads (2i, 2i+1),  V_i of width 2d,  A_b = softmax(Q_b_i K_b_iᵀ / √d)
        O_i = (1 − λ_init) · RMSNorm((w1 ⊙ A1 − λ ⊙ A2) V_i),   out = out_proj(concat_i O_i)
        λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init   (``lambda_form="reparam"``; λ vectors ~ N(0, 0.1²), fp32)

    ``lambda_init`` is a float (DiffCLIP: 0.8) or ``"ye"``: 0.8 − 0.6·exp(−0.3·depth) with ``depth`` the
    **0-based** layer index (DiffCLIP*). ``lambda_form`` names any registered λ form (:mod:`diffattn.lambdas`),
    built with ``lambda_options`` into ``lambda_fn``; the reparam vectors and the gate's ``gate_proj`` keep their
    checkpoint names on this module (``lambda_q1`` …). ``sub_norm=False`` drops the RMSNorm and the (1 − λ_init)
    scale; the default, None, takes the λ form's (:attr:`~diffattn.lambdas.LambdaForm.sub_norm`): on for every form
    but ``token_sigmoid``, which follows the Differential Transformer V2 (Ye et al. 2026) without it. ``softcap``
    soft-caps the logits (Gemma-2); ``sliding_window`` limits each query to the last keys.
    Parameters: standard attention plus 4d λ values and the 2d norm weight.

    At small width and depth, use a constant ``lambda_init`` (0.8) or ``sub_norm=False``. With ``"ye"``, a 2-layer
    model gets λ_init 0.2 and 0.36 and, with the sub-norm, failed to learn associative recall on every seed.
    Constant 0.8 instead gains +21.9 points [19.6, 24.1] at width 64, and dropping the sub-norm gains +22.5
    [19.6, 25.4] at width 128 (``diffattn study recall_ablation``, docs/studies.md).
    """

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0, lambda_init: float | str = DEFAULT_LAMBDA_INIT,
                 lambda_form: str = "reparam", lambda_options: dict | None = None, num_kv_heads: int | None = None,
                 qkv_bias: bool = True, out_bias: bool = True, causal: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, backend: str = "auto", rope: str | None = None, rope_theta: float = 10000.0,
                 sub_norm: bool | None = None, sub_norm_eps: float = 1e-5, sub_norm_affine: bool = True,
                 softcap: float | None = None, sliding_window: int | None = None):
        super().__init__()
        self._setup(dim, num_heads, num_kv_heads, qkv_bias, out_bias, causal, attn_drop, proj_drop, backend,
                    rope, rope_theta, paired=True, v_head_mult=2, softcap=softcap, sliding_window=sliding_window)
        self.diff_heads = num_heads // 2
        self._setup_lambda(dim=dim, depth=depth, lambda_init=lambda_init, lambda_form=lambda_form,
                           lambda_options=lambda_options, heads=self.diff_heads, norm_width=2 * self.head_dim,
                           sub_norm=sub_norm, sub_norm_eps=sub_norm_eps, sub_norm_affine=sub_norm_affine,
                           out_scale=True)

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):
        out = self._fused(x, q, k, v, attn_mask, causal, drop, need_weights, k_paired=True)
        if out is not None:
            return out, None  # (B, H, N, 2d)
        weight1, lam = self.lambda_weights(x)
        # Q heads 2i and 2i+1 (and K heads) are the two branches of differential head i
        res = _diff_attention_pairs(q, k, v, lam, weight1=weight1,
                             attn_mask=attn_mask, is_causal=causal, scale=self.scale, dropout_p=drop,
                             softcap=self.softcap, backend=self.backend, return_weights=need_weights)
        out, weights = res if need_weights else (res, None)
        return scaled_rms_norm(out, self.diff_norm, self.out_scale), weights  # (B, H, N, 2d)


class GatedDiffAttention(DiffAttention):
    """Multi-head differential gated self-attention, M-DGSA (Lygizou & Kalamaras 2025, §4, eq. 3, Algorithm 1).

        g = σ(X W_g + b_g) ∈ (0, 1)^{N×H}                      (``gate_proj``: dim → H, one layer)
        O_i = (1 − λ_init) · RMSNorm((g_i ⊙ A⁺_i − (1 − g_i) ⊙ A⁻_i) V_i)
        out = out_proj(concat_i O_i) [+ [Q⁺; Q⁻]]               (``q_residual``: DGViT uses it, DGT does not)

    g scales the row of its query token, so it commutes with the product by V and the O(N) backends serve it.
    λ_init fixed at 0.8 was best in the paper (App. B.5); ``"ye"`` gives Algorithm 1's depth schedule.
    ``gate_bias`` is the gate's ``bias`` option (``lambda_options`` may also set it); ``sub_norm`` as in
    :class:`DiffAttention`.
    """

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0, lambda_init: float | str = DEFAULT_LAMBDA_INIT,
                 lambda_form: str = "gate", lambda_options: dict | None = None, num_kv_heads: int | None = None,
                 qkv_bias: bool = True, out_bias: bool = True, causal: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, backend: str = "auto", rope: str | None = None, rope_theta: float = 10000.0,
                 sub_norm: bool | None = None, sub_norm_eps: float = 1e-5, sub_norm_affine: bool = True,
                 softcap: float | None = None, sliding_window: int | None = None, q_residual: bool = False,
                 gate_bias: bool = True):
        if lambda_form == "gate" and (lambda_options is None or isinstance(lambda_options, dict)):
            lambda_options = {"bias": gate_bias, **(lambda_options or {})}
        super().__init__(dim, num_heads, depth=depth, lambda_init=lambda_init, lambda_form=lambda_form,
                         lambda_options=lambda_options, num_kv_heads=num_kv_heads, qkv_bias=qkv_bias,
                         out_bias=out_bias, causal=causal, attn_drop=attn_drop, proj_drop=proj_drop,
                         backend=backend, rope=rope, rope_theta=rope_theta, sub_norm=sub_norm,
                         sub_norm_eps=sub_norm_eps, sub_norm_affine=sub_norm_affine, softcap=softcap,
                         sliding_window=sliding_window)
        self.q_residual = q_residual

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """g = σ(X W_g + b_g) as (B, H, N, 1) in float32 (float64 for a float64 layer)."""
        return self.lambda_fn.gate(x)

    def _output(self, out, q_lin):
        out = self.out_proj(out)
        if self.q_residual:  # + [Q⁺; Q⁻] = X W_Q (before the rotary embedding), (B, N, dim)
            out = out + q_lin
        return self.proj_drop(out)


class DiffAttentionV2(_DiffBase):
    """Differential Transformer V2 (Ye et al., microsoft/unilm ``multihead_flashdiffv2.py``).

        Q = x W_Q: 2h heads of width d,  K = x W_K, V = x W_V: h_kv heads of width d, shared by both
        branches;  A_j = softmax(Q_j K_{g(j)}ᵀ / √d) for query head j, g(j) = j // (2h / h_kv)
        O_i = A_{2i} V_{g(2i)} − λ_i(x_t) ⊙ A_{2i+1} V_{g(2i)},   λ_i(x_t) = σ(x_t W_λ)_i   (no bias)
        out = out_proj(concat_i O_i)   (h·d → dim; no sub-norm, no (1 − λ_init) scale)

    Shapes: x (B, N, dim) → (B, N, dim); q_proj dim → 2h·d, k_proj and v_proj dim → h_kv·d, out_proj h·d → dim,
    ``lambda_fn.lambda_proj`` dim → h. The head width d is ``head_dim`` (the official module's argument of the same
    name, which may differ from dim / h), by default dim / h. The pair (2i, 2i+1) always sits inside one GQA group
    (h must be divisible by h_kv), so both branches read the same K and V head. Other λ forms may be named with
    ``lambda_form``; ``sub_norm=True`` adds a per-head RMSNorm of width d. :mod:`diffattn.convert.unilm` converts
    the official module's state dicts (``o_proj``, ``lambda_proj``, interleaved RoPE) both ways.
    """

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0, lambda_init: float | str = DEFAULT_LAMBDA_INIT,
                 lambda_form: str = "token_sigmoid", lambda_options: dict | None = None,
                 num_kv_heads: int | None = None, qkv_bias: bool = True, out_bias: bool = True, causal: bool = False,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, backend: str = "auto", rope: str | None = None,
                 rope_theta: float = 10000.0, sub_norm: bool = False, sub_norm_eps: float = 1e-5,
                 sub_norm_affine: bool = True, softcap: float | None = None, sliding_window: int | None = None,
                 head_dim: int | None = None):
        super().__init__()
        self._setup(dim, num_heads, num_kv_heads, qkv_bias, out_bias, causal, attn_drop, proj_drop, backend,
                    rope, rope_theta, paired=False, q_heads_per_head=2, softcap=softcap,
                    sliding_window=sliding_window, head_dim=head_dim)
        self.diff_heads = num_heads
        self._setup_lambda(dim=dim, depth=depth, lambda_init=lambda_init, lambda_form=lambda_form,
                           lambda_options=lambda_options, heads=num_heads, norm_width=self.head_dim,
                           sub_norm=sub_norm, sub_norm_eps=sub_norm_eps, sub_norm_affine=sub_norm_affine,
                           out_scale=False)

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):
        out = self._fused(x, q, k, v, attn_mask, causal, drop, need_weights, k_paired=False)
        if out is not None:
            return out, None  # (B, h, N, d)
        weight1, lam = self.lambda_weights(x)  # λ: (B, h, N, 1)
        res = _diff_attention_pairs(q, k, v, lam, k_paired=False, weight1=weight1, attn_mask=attn_mask,
                             is_causal=causal, scale=self.scale, dropout_p=drop, softcap=self.softcap,
                             backend=self.backend, return_weights=need_weights)
        out, weights = res if need_weights else (res, None)
        return scaled_rms_norm(out, self.diff_norm, self.out_scale), weights  # (B, h, N, d)


ATTENTION_TYPES = {"standard": Attention, "diff": DiffAttention, "gated": GatedDiffAttention,
                   "diff_v2": DiffAttentionV2}


def attention_class(name: str) -> type[nn.Module]:
    """The layer class of attention kind ``name`` (the names of :data:`ATTENTION_TYPES`: ``"standard"``, ``"diff"``,
    ``"gated"``, ``"diff_v2"``, ``"grouped"``)."""
    if name not in ATTENTION_TYPES:
        raise ValueError(f"attention must be one of {tuple(ATTENTION_TYPES)}, got {name!r}")
    return ATTENTION_TYPES[name]


def attention_kind(module: nn.Module) -> str | None:
    """The kind (a name of :data:`ATTENTION_TYPES`) of an attention layer of the library, or None for any other
    module: the registered class nearest in ``module``'s class hierarchy, so a subclass of a registered layer gets
    its parent's kind unless registered itself (``GatedDiffAttention`` is ``"gated"``, not ``"diff"``)."""
    kinds = {cls: name for name, cls in ATTENTION_TYPES.items()}
    return next((kinds[cls] for cls in type(module).__mro__ if cls in kinds), None)
