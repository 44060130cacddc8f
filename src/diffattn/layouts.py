"""Exact converters between diffattn's differential-attention layout and the layouts users have weights in.

Three layouts of one differential attention layer (DESIGN.md §3.1), for a layer of width D with h standard
heads of width d = D/h, H = h/2 differential heads and h_kv key/value heads (grouped-query attention when
h_kv < h):

- **adjacent** (diffattn, unilm, DiffCLIP; seed 003): differential head i reads Q/K heads 2i (branch 1) and
  2i+1 (branch 2); ``v_proj`` holds h_kv/2 value heads of width 2d, value head m = d-wide heads (2m, 2m+1).
- **halves** (transformers' ``DiffLlamaAttention``): differential head i reads Q heads i and i + h/2, K
  heads m and m + h_kv/2 with m = i // (h/h_kv) (``repeat_kv`` then ``chunk`` along heads), and the value
  V_m ‖ V_{m + h_kv/2}. One permutation of d-wide heads maps it onto the adjacent layout, the same for Q, K
  and V:

      adjacent[2i] = halves[i],   adjacent[2i + 1] = halves[i + n/2]     (n = h for Q; n = h_kv for K, V)

  Its output order (differential head i, channels [branch of V_m ‖ V_{m+h_kv/2}]) is ours, so ``o_proj``
  is kept as is. Its "groupnorm" is an RMSNorm of width 2d **without** affine weight, eps =
  ``config.rms_norm_eps``, and λ_init = 0.8 − 0.6·exp(−0.3·layer_idx) with a 0-based ``layer_idx``.
- **timm** (``timm.layers.DiffAttention(dim, num_heads=n)``): n counts *differential* heads; it halves the
  head width (head_dim = D/n/2) and views Q/K as 2n heads, pairing 2j and 2j+1, V as n heads of width
  2·head_dim: the adjacent layout of ``diffattn.DiffAttention(dim, num_heads=2n)``. Only the fused ``qkv``
  is split and keys are renamed (``proj`` → ``out_proj``, ``sub_norm`` → ``diff_norm``, ``lambda_a/b`` →
  ``lambda_fn.lambda_a/b`` for ``dual_lambda=True``). timm has no GQA and no rotary embedding; its
  ``qk_norm`` and ``scale_norm`` have no counterpart here and are refused.

Every converter is explicit: it reads head counts from its arguments or the source module, checks each key
and shape, and raises ``ValueError`` for anything the target layout cannot express exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn as nn

from .lambdas import lambda_init_ye
from .layers import DiffAttention, GatedDiffAttention
from .layers.norm import head_rms_norm

__all__ = [
    "halves_to_adjacent_perm",
    "adjacent_to_halves_perm",
    "permute_heads",
    "diffllama_to_diffattn_state_dict",
    "diffattn_to_diffllama_state_dict",
    "timm_to_diffattn_state_dict",
    "diffattn_to_timm_state_dict",
    "from_diffllama_attention",
    "to_diffllama_attention",
    "from_timm_diff_attention",
    "to_timm_diff_attention",
]

StateDict = Mapping[str, torch.Tensor]


# ------------------------------------------------------------------------------------------ permutations


def _check_even_heads(name: str, n) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 2 or n % 2:
        raise ValueError(f"{name} must be an even integer >= 2 (heads pair into differential heads), "
                         f"got {n!r}")


def halves_to_adjacent_perm(num_heads: int) -> torch.Tensor:
    """Index ``p`` with ``adjacent_head[j] = halves_head[p[j]]``: p = [0, n/2, 1, n/2 + 1, …, n/2 − 1, n − 1].

    Applies to Q heads (n = h), K heads and d-wide V heads (n = h_kv) alike (module docstring).
    """
    _check_even_heads("num_heads", num_heads)
    half = num_heads // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()  # (n,)


def adjacent_to_halves_perm(num_heads: int) -> torch.Tensor:
    """Inverse of :func:`halves_to_adjacent_perm`: p = [0, 2, 4, …, n − 2, 1, 3, …, n − 1]."""
    _check_even_heads("num_heads", num_heads)
    return torch.cat([torch.arange(0, num_heads, 2), torch.arange(1, num_heads, 2)])  # (n,)


def permute_heads(t: torch.Tensor, perm: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Reorder the heads along dim 0 of a weight (n·d, D) or bias (n·d,): out head j = in head perm[j]."""
    n = perm.numel()
    if t.shape[0] != n * head_dim:
        raise ValueError(f"tensor of shape {tuple(t.shape)} does not hold {n} heads of width "
                         f"head_dim={head_dim} along dim 0 (needs {n * head_dim} rows)")
    return t.reshape(n, head_dim, *t.shape[1:])[perm.to(t.device)].reshape(t.shape).clone()


def _take(sd: StateDict, key: str, where: str) -> torch.Tensor:
    if key not in sd:
        raise ValueError(f"{where} state dict has no {key!r}; keys: {sorted(sd)}")
    return sd[key]


def _check_no_extra(sd: StateDict, known: set[str], where: str) -> None:
    extra = sorted(set(sd) - known)
    if extra:
        raise ValueError(f"{where} state dict has keys this converter cannot express exactly: {extra}")


# ------------------------------------------------------------------------------------ DiffLlama (halves)

_LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def diffllama_to_diffattn_state_dict(sd: StateDict, *, num_heads: int, num_kv_heads: int, head_dim: int,
                                     diff_norm_affine: bool = False) -> dict[str, torch.Tensor]:
    """A ``DiffLlamaAttention`` state dict (halves) → a :class:`~diffattn.DiffAttention` one (adjacent).

    Q, K and V rows are permuted with :func:`halves_to_adjacent_perm`; ``o_proj`` → ``out_proj`` unchanged;
    the λ vectors are copied. DiffLlama's sub-norm has no weight: with ``diff_norm_affine=True`` a
    ``diff_norm.weight`` of ones is added (for a target whose ``diff_norm`` is affine), which computes the
    same function.
    """
    _check_even_heads("num_heads", num_heads)
    _check_even_heads("num_kv_heads", num_kv_heads)
    pq, pkv = halves_to_adjacent_perm(num_heads), halves_to_adjacent_perm(num_kv_heads)
    out: dict[str, torch.Tensor] = {}
    known = set()
    for hf, ours, perm in (("q_proj", "q_proj", pq), ("k_proj", "k_proj", pkv), ("v_proj", "v_proj", pkv),
                           ("o_proj", "out_proj", None)):
        for kind in ("weight", "bias"):
            key = f"{hf}.{kind}"
            if kind == "weight" or key in sd:
                t = _take(sd, key, "DiffLlama attention")
                out[f"{ours}.{kind}"] = t.clone() if perm is None else permute_heads(t, perm, head_dim)
                known.add(key)
    for name in _LAMBDAS:
        out[name] = _take(sd, name, "DiffLlama attention").clone()
        known.add(name)
    _check_no_extra(sd, known, "DiffLlama attention")
    if diff_norm_affine:
        ref = out["q_proj.weight"]
        out["diff_norm.weight"] = torch.ones(2 * head_dim, dtype=ref.dtype, device=ref.device)
    return out


def diffattn_to_diffllama_state_dict(sd: StateDict, *, num_heads: int, num_kv_heads: int, head_dim: int,
                                     fold_norm: bool = False,
                                     attention_bias: bool | None = None) -> dict[str, torch.Tensor]:
    """A :class:`~diffattn.DiffAttention` state dict (adjacent) → a ``DiffLlamaAttention`` one (halves).

    DiffLlama has no sub-norm weight. A ``diff_norm.weight`` of ones is dropped; any other weight w raises
    unless ``fold_norm=True``, which folds it into ``o_proj`` (out = W_o · diag(w ⊗ 1_H) · y: exact in real
    arithmetic, one rounding per weight). DiffLlama has one ``attention_bias`` flag for q/k/v/o: with
    ``attention_bias=True`` (default: True when any bias is present) missing biases are filled with zeros,
    which changes nothing.
    """
    _check_even_heads("num_heads", num_heads)
    _check_even_heads("num_kv_heads", num_kv_heads)
    pq, pkv = adjacent_to_halves_perm(num_heads), adjacent_to_halves_perm(num_kv_heads)
    known = {f"{p}.{k}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for k in ("weight", "bias")}
    known |= set(_LAMBDAS) | {"diff_norm.weight"}
    _check_no_extra(sd, known, "DiffAttention")
    if attention_bias is None:
        attention_bias = any(f"{p}.bias" in sd for p in ("q_proj", "k_proj", "v_proj", "out_proj"))
    out: dict[str, torch.Tensor] = {}
    w_o = _take(sd, "out_proj.weight", "DiffAttention").clone()
    if "diff_norm.weight" in sd:
        w = sd["diff_norm.weight"]
        if not torch.equal(w, torch.ones_like(w)):
            if not fold_norm:
                raise ValueError("diff_norm.weight is not all ones and DiffLlama's sub-norm has no weight; "
                                 "pass fold_norm=True to fold it into o_proj (exact up to one rounding per "
                                 "weight)")
            w_o = w_o * w.to(w_o.dtype).repeat(num_heads // 2)  # (D, H·2d) columns scaled by w per head
    for ours, hf, perm in (("q_proj", "q_proj", pq), ("k_proj", "k_proj", pkv), ("v_proj", "v_proj", pkv),
                           ("out_proj", "o_proj", None)):
        weight = w_o if ours == "out_proj" else _take(sd, f"{ours}.weight", "DiffAttention")
        out[f"{hf}.weight"] = weight if perm is None else permute_heads(weight, perm, head_dim)
        bias = sd.get(f"{ours}.bias")
        if bias is not None and not attention_bias:
            raise ValueError(f"attention_bias=False but the state dict has {ours}.bias")
        if attention_bias:
            if bias is None:
                bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
            out[f"{hf}.bias"] = bias.clone() if perm is None else permute_heads(bias, perm, head_dim)
    for name in _LAMBDAS:
        out[name] = _take(sd, name, "DiffAttention").clone()
    return out


def _diffllama_rope_theta(config) -> float:
    rp = getattr(config, "rope_parameters", None) or {}
    rope_type = rp.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"config.rope_parameters['rope_type'] must be 'default' (plain RoPE) to convert, "
                         f"got {rope_type!r}: diffattn's rotary embedding has no scaled variants")
    return float(rp.get("rope_theta", 10000.0))


def from_diffllama_attention(module: nn.Module, layer_idx: int | None = None, *, backend: str = "auto",
                             diff_norm_affine: bool = False) -> DiffAttention:
    """A ``DiffLlamaAttention`` → an equivalent causal :class:`~diffattn.DiffAttention` (``rope="half"``).

    ``layer_idx`` (default ``module.layer_idx``, 0-based) becomes ``depth``; λ_init is the module's own value,
    0.8 − 0.6·exp(−0.3·layer_idx). ``diff_norm`` gets eps = ``config.rms_norm_eps`` and, like DiffLlama's, no
    weight (``diff_norm_affine=True``: a weight of ones). Parameters keep their dtype and device.
    """
    cfg = getattr(module, "config", None)
    needed = ("q_proj", "k_proj", "v_proj", "o_proj", "lambda_q1")
    if cfg is None or not all(hasattr(module, n) for n in needed):
        raise ValueError(f"module must be a transformers DiffLlamaAttention, got {type(module).__name__}")
    layer_idx = module.layer_idx if layer_idx is None else layer_idx
    if not isinstance(layer_idx, int) or layer_idx < 0:
        raise ValueError(f"layer_idx must be the 0-based layer index (int >= 0), got {layer_idx!r}")
    h, h_kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, module.head_dim
    if h * d != cfg.hidden_size:
        raise ValueError(f"config.head_dim={d} × num_attention_heads={h} must equal "
                         f"hidden_size={cfg.hidden_size}: diffattn's layers take head_dim = dim / num_heads")
    bias = bool(cfg.attention_bias)
    ours = DiffAttention(cfg.hidden_size, h, depth=layer_idx, lambda_init=float(module.lambda_init),
                         num_kv_heads=h_kv, qkv_bias=bias, out_bias=bias, causal=True, backend=backend,
                         rope="half", rope_theta=_diffllama_rope_theta(cfg))
    ours.diff_norm = head_rms_norm(2 * d, eps=float(cfg.rms_norm_eps), affine=diff_norm_affine)
    sd = diffllama_to_diffattn_state_dict(module.state_dict(), num_heads=h, num_kv_heads=h_kv, head_dim=d,
                                          diff_norm_affine=diff_norm_affine)
    ours.load_state_dict(sd, strict=True, assign=True)
    return ours.to(module.q_proj.weight.device).train(module.training)


def _check_convertible(module: nn.Module, target: str) -> None:
    if not isinstance(module, DiffAttention) or isinstance(module, GatedDiffAttention):
        raise ValueError(f"module must be a diffattn.DiffAttention (not gated) to convert to {target}, got "
                         f"{type(module).__name__}")
    if isinstance(module.diff_norm, nn.Identity):
        raise ValueError(f"module has no sub-norm (sub_norm=False); {target} always applies one")
    if module.diff_norm.eps is None:
        raise ValueError("module.diff_norm.eps is None (dtype dependent); set a float eps before converting")


def _diff_norm_weight(module: DiffAttention) -> torch.Tensor | None:
    return module.diff_norm.weight if module.diff_norm.elementwise_affine else None


def to_diffllama_attention(module: DiffAttention, config=None, layer_idx: int | None = None, *,
                           fold_norm: bool = False) -> nn.Module:
    """A :class:`~diffattn.DiffAttention` (``rope="half"``) → an equivalent ``DiffLlamaAttention``.

    ``layer_idx`` (default ``module.depth``) must give DiffLlama's λ_init = 0.8 − 0.6·exp(−0.3·layer_idx)
    equal to the module's (DiffLlama derives λ_init from it and cannot store another). ``config`` (a
    ``DiffLlamaConfig``) is built from the module when None, else checked against it. ``rms_norm_eps`` is
    ``module.diff_norm.eps``. See :func:`diffattn_to_diffllama_state_dict` for ``fold_norm`` and biases.
    """
    from transformers import DiffLlamaConfig
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention, lambda_init_fn

    _check_convertible(module, "DiffLlama")
    if module.lambda_form != "reparam":
        raise ValueError(f"DiffLlama uses the reparam λ; module has lambda_form={module.lambda_form!r}")
    if module.rotary is None or module.rotary.style != "half":
        style = None if module.rotary is None else module.rotary.style
        raise ValueError(f"DiffLlama applies rotate-half RoPE; module needs rope='half', got rope={style!r}")
    layer_idx = module.depth if layer_idx is None else layer_idx
    if not isinstance(layer_idx, int) or layer_idx < 0:
        raise ValueError(f"layer_idx must be the 0-based layer index (int >= 0), got {layer_idx!r}")
    if not math.isclose(lambda_init_fn(layer_idx), module.lambda_init, rel_tol=0.0, abs_tol=1e-12):
        raise ValueError(f"module.lambda_init={module.lambda_init} but DiffLlama's λ_init for "
                         f"layer_idx={layer_idx} is {lambda_init_fn(layer_idx)}; build the module with "
                         f"lambda_init='ye' and depth=layer_idx, or pass the right layer_idx")
    biases = [getattr(module, p).bias is not None for p in ("q_proj", "k_proj", "v_proj", "out_proj")]
    eps = float(module.diff_norm.eps)
    theta = float(module.rotary.base)
    if config is None:
        config = DiffLlamaConfig(hidden_size=module.dim, num_attention_heads=module.num_heads,
                                 num_key_value_heads=module.num_kv_heads, head_dim=module.head_dim,
                                 intermediate_size=4 * module.dim, num_hidden_layers=layer_idx + 1,
                                 rms_norm_eps=eps, attention_bias=any(biases), attention_dropout=0.0,
                                 rope_parameters={"rope_type": "default", "rope_theta": theta})
    else:
        want = {"hidden_size": module.dim, "num_attention_heads": module.num_heads,
                "num_key_value_heads": module.num_kv_heads, "head_dim": module.head_dim, "rms_norm_eps": eps}
        for k, v in want.items():
            if getattr(config, k) != v:
                raise ValueError(f"config.{k}={getattr(config, k)!r} does not match the module ({v!r})")
        if _diffllama_rope_theta(config) != theta:
            raise ValueError(f"config rope_theta={_diffllama_rope_theta(config)} does not match the "
                             f"module ({theta})")
        if any(biases) and not config.attention_bias:
            raise ValueError("config.attention_bias=False but the module has biases")
    sd = {k: v for k, v in module.state_dict().items()}
    sd = diffattn_to_diffllama_state_dict(sd, num_heads=module.num_heads, num_kv_heads=module.num_kv_heads,
                                          head_dim=module.head_dim, fold_norm=fold_norm,
                                          attention_bias=bool(config.attention_bias))
    hf = DiffLlamaAttention(config, layer_idx)
    hf.load_state_dict(sd, strict=True, assign=True)
    return hf.to(module.q_proj.weight.device).train(module.training)


# ------------------------------------------------------------------------------------------------ timm


def _ye_depth(lambda_init: float) -> int:
    """The 0-based depth whose Ye schedule gives exactly ``lambda_init``, else 0 (recorded as ``depth``)."""
    for k in range(256):
        if lambda_init_ye(k) == lambda_init:
            return k
    return 0


def timm_to_diffattn_state_dict(sd: StateDict) -> dict[str, torch.Tensor]:
    """A ``timm.layers.DiffAttention`` state dict → a :class:`~diffattn.DiffAttention` state dict (same
    layout).

    ``qkv`` (3D, D) splits into ``q_proj``/``k_proj``/``v_proj`` rows [0, D), [D, 2D), [2D, 3D); ``proj`` →
    ``out_proj``; ``sub_norm`` → ``diff_norm``; ``lambda_a/b`` (``dual_lambda``) → ``lambda_fn.lambda_a/b``.
    """
    known = {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "sub_norm.weight", "lambda_a", "lambda_b",
             *_LAMBDAS}
    bad = sorted(k for k in sd if k.startswith(("q_norm.", "k_norm.", "norm.")))
    if bad:
        raise ValueError(f"timm DiffAttention with qk_norm or scale_norm has no diffattn counterpart "
                         f"(keys {bad})")
    _check_no_extra(sd, known, "timm DiffAttention")
    out: dict[str, torch.Tensor] = {}
    for kind in ("weight", "bias"):
        if kind == "weight" or "qkv.bias" in sd:
            parts = _take(sd, f"qkv.{kind}", "timm").chunk(3, dim=0)
            for name, t in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                out[f"{name}.{kind}"] = t.clone()
        if kind == "weight" or "proj.bias" in sd:
            out[f"out_proj.{kind}"] = _take(sd, f"proj.{kind}", "timm").clone()
    if "lambda_a" in sd:
        out["lambda_fn.lambda_a"] = _take(sd, "lambda_a", "timm").clone()
        out["lambda_fn.lambda_b"] = _take(sd, "lambda_b", "timm").clone()
    else:
        for name in _LAMBDAS:
            out[name] = _take(sd, name, "timm DiffAttention").clone()
    if "sub_norm.weight" in sd:
        out["diff_norm.weight"] = sd["sub_norm.weight"].clone()
    return out


def diffattn_to_timm_state_dict(sd: StateDict, *, qkv_bias: bool | None = None) -> dict[str, torch.Tensor]:
    """A :class:`~diffattn.DiffAttention` state dict → a ``timm.layers.DiffAttention`` state dict (same
    layout).

    timm fuses q/k/v with one bias flag: with ``qkv_bias=True`` (default: True when any of the three has a
    bias) missing biases are filled with zeros. A non-affine ``diff_norm`` gets a ``sub_norm.weight`` of
    ones.
    """
    known = {f"{p}.{k}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for k in ("weight", "bias")}
    known |= set(_LAMBDAS) | {"diff_norm.weight", "lambda_fn.lambda_a", "lambda_fn.lambda_b"}
    _check_no_extra(sd, known, "DiffAttention")
    w = [_take(sd, f"{p}.weight", "DiffAttention") for p in ("q_proj", "k_proj", "v_proj")]
    out = {"qkv.weight": torch.cat(w, dim=0)}
    has_bias = [f"{p}.bias" in sd for p in ("q_proj", "k_proj", "v_proj")]
    qkv_bias = any(has_bias) if qkv_bias is None else qkv_bias
    if any(has_bias) and not qkv_bias:
        raise ValueError("qkv_bias=False but the state dict has q/k/v biases")
    if qkv_bias:
        out["qkv.bias"] = torch.cat([sd[f"{p}.bias"] if f"{p}.bias" in sd else
                                     torch.zeros(t.shape[0], dtype=t.dtype, device=t.device)
                                     for p, t in zip(("q_proj", "k_proj", "v_proj"), w, strict=True)])
    out["proj.weight"] = sd["out_proj.weight"].clone()
    if "out_proj.bias" in sd:
        out["proj.bias"] = sd["out_proj.bias"].clone()
    if "lambda_fn.lambda_a" in sd:
        out["lambda_a"] = sd["lambda_fn.lambda_a"].clone()
        out["lambda_b"] = _take(sd, "lambda_fn.lambda_b", "DiffAttention").clone()
    else:
        for name in _LAMBDAS:
            out[name] = _take(sd, name, "DiffAttention").clone()
    if "diff_norm.weight" in sd:
        out["sub_norm.weight"] = sd["diff_norm.weight"].clone()
    return out


def from_timm_diff_attention(module: nn.Module, *, backend: str = "auto") -> DiffAttention:
    """A ``timm.layers.DiffAttention(dim, num_heads=n)`` → :class:`~diffattn.DiffAttention` ``(dim, 2n)``.

    λ form (reparam or ``dual_scalar``), λ_init, biases, dropouts, sub-norm eps and weights carry over
    exactly; the result is non-causal (timm takes ``is_causal`` per call; pass ``is_causal=True`` to ours
    the same way).
    """
    from timm.layers import DiffAttention as TimmDiffAttention

    if not isinstance(module, TimmDiffAttention):
        raise ValueError(f"module must be a timm.layers.DiffAttention, got {type(module).__name__}")
    for name in ("q_norm", "k_norm", "norm"):
        if not isinstance(getattr(module, name), nn.Identity):
            raise ValueError(f"timm DiffAttention with {name} (qk_norm / scale_norm) has no diffattn "
                             f"counterpart")
    dim = module.qkv.in_features
    lam = float(module.lambda_init)
    ours = DiffAttention(dim, 2 * module.num_heads, depth=_ye_depth(lam), lambda_init=lam,
                         lambda_form="dual_scalar" if module.dual_lambda else "reparam",
                         qkv_bias=module.qkv.bias is not None, out_bias=module.proj.bias is not None,
                         attn_drop=float(module.attn_drop_p), proj_drop=float(module.proj_drop.p),
                         backend=backend)
    affine = getattr(module.sub_norm, "weight", None) is not None
    ours.diff_norm = head_rms_norm(2 * module.head_dim, eps=float(module.sub_norm.eps), affine=affine)
    ours.load_state_dict(timm_to_diffattn_state_dict(module.state_dict()), strict=True, assign=True)
    return ours.to(module.qkv.weight.device).train(module.training)


def to_timm_diff_attention(module: DiffAttention) -> nn.Module:
    """A :class:`~diffattn.DiffAttention` ``(dim, h)`` → ``timm.layers.DiffAttention(dim, num_heads=h/2)``.

    Needs what timm can express: no GQA, no rotary embedding, λ form reparam or ``dual_scalar``, one bias
    flag for q/k/v (missing ones filled with zeros). λ_init and the sub-norm eps are set on the timm module.
    A causal layer converts too; timm applies the causal mask only when called with ``is_causal=True``.
    """
    from timm.layers import DiffAttention as TimmDiffAttention

    _check_convertible(module, "timm")
    if module.lambda_form not in ("reparam", "dual_scalar"):
        raise ValueError(f"timm DiffAttention has λ forms reparam and dual_scalar; module has "
                         f"lambda_form={module.lambda_form!r}")
    if module.num_kv_heads != module.num_heads:
        raise ValueError(f"timm DiffAttention has no grouped-query attention; module has "
                         f"num_kv_heads={module.num_kv_heads} != num_heads={module.num_heads}")
    if module.rotary is not None:
        raise ValueError(f"timm DiffAttention has no rotary embedding; module has "
                         f"rope={module.rotary.style!r}")
    qkv_bias = any(getattr(module, p).bias is not None for p in ("q_proj", "k_proj", "v_proj"))
    timm_mod = TimmDiffAttention(module.dim, num_heads=module.num_heads // 2, qkv_bias=qkv_bias,
                                 proj_bias=module.out_proj.bias is not None,
                                 attn_drop=float(module.attn_drop), proj_drop=float(module.proj_drop.p),
                                 depth=module.depth,
                                 dual_lambda=module.lambda_form == "dual_scalar")
    timm_mod.lambda_init = float(module.lambda_init)
    timm_mod.sub_norm.eps = float(module.diff_norm.eps)
    sd = dict(module.state_dict())
    if _diff_norm_weight(module) is None:
        ref = module.q_proj.weight
        sd["diff_norm.weight"] = torch.ones(2 * module.head_dim, dtype=ref.dtype, device=ref.device)
    timm_mod.load_state_dict(diffattn_to_timm_state_dict(sd, qkv_bias=qkv_bias), strict=True, assign=True)
    return timm_mod.to(module.q_proj.weight.device).train(module.training)
