"""DiffLlama (transformers' ``DiffLlamaAttention`` / ``DiffLlamaForCausalLM``) ↔ diffattn, exactly.

Two layouts of one differential attention layer (docs/design.md), for a layer of width D with h standard heads of
width d = D/h, H = h/2 differential heads and h_kv key/value heads (grouped-query attention when h_kv < h):

- **adjacent** (diffattn; Ye et al. 2024's code and DiffCLIP's module): differential head i reads Q/K heads 2i
  (branch 1) and 2i+1 (branch 2); ``v_proj`` holds h_kv/2 value heads of width 2d, value head m = d-wide heads
  (2m, 2m+1).
- **halves** (transformers' ``DiffLlamaAttention``): differential head i reads Q heads i and i + h/2, K heads m and
  m + h_kv/2 with m = i // (h/h_kv) (``repeat_kv`` then ``chunk`` along heads), and the value V_m ‖ V_{m + h_kv/2}.
  One permutation of d-wide heads maps it onto the adjacent layout, the same for Q, K and V:

      adjacent[2i] = halves[i],   adjacent[2i + 1] = halves[i + n/2]     (n = h for Q; n = h_kv for K, V)

  Its output order (differential head i, channels [branch of V_m ‖ V_{m+h_kv/2}]) is ours, so ``o_proj`` is kept
  as is. Its "groupnorm" is an RMSNorm of width 2d **without** affine weight, eps = ``config.rms_norm_eps``, and
  λ_init = 0.8 − 0.6·exp(−0.3·layer_idx) with a 0-based ``layer_idx`` (Ye et al. 2024 §2.1).

Layer level: :func:`from_diffllama_attention`, :func:`to_diffllama_attention` and the state-dict functions. Model
level: :func:`from_diffllama`, :func:`to_diffllama`, :func:`to_diffllama_state_dict` between
``DiffLlamaForCausalLM`` and :class:`~diffattn.models.CausalLM`. Every converter keeps the source's dtype and device
(float64 stays float64, bf16 stays bf16), reads head counts from its arguments or the source, checks each key and
shape, and raises ``ValueError`` for anything the target cannot express exactly.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn as nn

from ..formats import saved_kind, wrong_kind
from ..layers import AttentionSpec, DiffAttention
from ..models.causal_lm import CausalLM
from ._common import LAMBDAS, StateDict, check_convertible, check_even_heads, check_no_extra, take

__all__ = [
    "halves_to_adjacent_perm",
    "adjacent_to_halves_perm",
    "permute_heads",
    "diffllama_to_diffattn_state_dict",
    "diffattn_to_diffllama_state_dict",
    "from_diffllama_attention",
    "to_diffllama_attention",
    "from_diffllama",
    "to_diffllama",
    "to_diffllama_state_dict",
]


# ------------------------------------------------------------------------------------------ permutations


def halves_to_adjacent_perm(num_heads: int) -> torch.Tensor:
    """Index ``p`` with ``adjacent_head[j] = halves_head[p[j]]``: p = [0, n/2, 1, n/2 + 1, …, n/2 − 1, n − 1].

    Applies to Q heads (n = h), K heads and d-wide V heads (n = h_kv) alike (module docstring).
    """
    check_even_heads("num_heads", num_heads)
    half = num_heads // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()  # (n,)


def adjacent_to_halves_perm(num_heads: int) -> torch.Tensor:
    """Inverse of :func:`halves_to_adjacent_perm`: p = [0, 2, 4, …, n − 2, 1, 3, …, n − 1]."""
    check_even_heads("num_heads", num_heads)
    return torch.cat([torch.arange(0, num_heads, 2), torch.arange(1, num_heads, 2)])  # (n,)


def permute_heads(t: torch.Tensor, perm: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Reorder the heads along dim 0 of a weight (n·d, D) or bias (n·d,): out head j = in head perm[j]."""
    n = perm.numel()
    if t.shape[0] != n * head_dim:
        raise ValueError(f"tensor of shape {tuple(t.shape)} does not hold {n} heads of width "
                         f"head_dim={head_dim} along dim 0 (needs {n * head_dim} rows)")
    return t.reshape(n, head_dim, *t.shape[1:])[perm.to(t.device)].reshape(t.shape).clone()


# ------------------------------------------------------------------------------------ DiffLlama (halves)

def diffllama_to_diffattn_state_dict(sd: StateDict, *, num_heads: int, num_kv_heads: int, head_dim: int,
                                     diff_norm_affine: bool = False) -> dict[str, torch.Tensor]:
    """A ``DiffLlamaAttention`` state dict (halves) → a :class:`~diffattn.DiffAttention` one (adjacent).

    Q, K and V rows are permuted with :func:`halves_to_adjacent_perm`; ``o_proj`` → ``out_proj`` unchanged;
    the λ vectors are copied. DiffLlama's sub-norm has no weight: with ``diff_norm_affine=True`` a
    ``diff_norm.weight`` of ones is added (for a target whose ``diff_norm`` is affine), which computes the
    same function.
    """
    check_even_heads("num_heads", num_heads)
    check_even_heads("num_kv_heads", num_kv_heads)
    pq, pkv = halves_to_adjacent_perm(num_heads), halves_to_adjacent_perm(num_kv_heads)
    out: dict[str, torch.Tensor] = {}
    known = set()
    for hf, ours, perm in (("q_proj", "q_proj", pq), ("k_proj", "k_proj", pkv), ("v_proj", "v_proj", pkv),
                           ("o_proj", "out_proj", None)):
        for kind in ("weight", "bias"):
            key = f"{hf}.{kind}"
            if kind == "weight" or key in sd:
                t = take(sd, key, "DiffLlama attention")
                out[f"{ours}.{kind}"] = t.clone() if perm is None else permute_heads(t, perm, head_dim)
                known.add(key)
    for name in LAMBDAS:
        out[name] = take(sd, name, "DiffLlama attention").clone()
        known.add(name)
    check_no_extra(sd, known, "DiffLlama attention")
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
    check_even_heads("num_heads", num_heads)
    check_even_heads("num_kv_heads", num_kv_heads)
    pq, pkv = adjacent_to_halves_perm(num_heads), adjacent_to_halves_perm(num_kv_heads)
    known = {f"{p}.{k}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for k in ("weight", "bias")}
    known |= set(LAMBDAS) | {"diff_norm.weight"}
    check_no_extra(sd, known, "DiffAttention")
    if attention_bias is None:
        attention_bias = any(f"{p}.bias" in sd for p in ("q_proj", "k_proj", "v_proj", "out_proj"))
    out: dict[str, torch.Tensor] = {}
    w_o = take(sd, "out_proj.weight", "DiffAttention").clone()
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
        weight = w_o if ours == "out_proj" else take(sd, f"{ours}.weight", "DiffAttention")
        out[f"{hf}.weight"] = weight if perm is None else permute_heads(weight, perm, head_dim)
        bias = sd.get(f"{ours}.bias")
        if bias is not None and not attention_bias:
            raise ValueError(f"attention_bias=False but the state dict has {ours}.bias")
        if attention_bias:
            if bias is None:
                bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
            out[f"{hf}.bias"] = bias.clone() if perm is None else permute_heads(bias, perm, head_dim)
    for name in LAMBDAS:
        out[name] = take(sd, name, "DiffAttention").clone()
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
                         rope="half", rope_theta=_diffllama_rope_theta(cfg), sub_norm_eps=float(cfg.rms_norm_eps),
                         sub_norm_affine=diff_norm_affine)
    sd = diffllama_to_diffattn_state_dict(module.state_dict(), num_heads=h, num_kv_heads=h_kv, head_dim=d,
                                          diff_norm_affine=diff_norm_affine)
    ours.load_state_dict(sd, strict=True, assign=True)
    return ours.to(module.q_proj.weight.device).train(module.training)


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

    check_convertible(module, "DiffLlama")
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


# ------------------------------------------------------------------------------------------ model level


def _diffllama_config(model: CausalLM):
    from transformers import DiffLlamaConfig

    if model.attention != "diff":
        raise ValueError(f"DiffLlama is differential attention; model has attention={model.attention!r}")
    blk = model.blocks[0]
    attn = blk.attn
    eps = blk.norm1.eps
    if attn.diff_norm.eps != eps:
        raise ValueError(f"DiffLlama uses one rms_norm_eps for every norm; model has norm_eps={eps} and "
                         f"diff_norm_eps={attn.diff_norm.eps}")
    if blk.mlp.gate_proj.bias is not None:
        raise ValueError("DiffLlama's MLP has no bias; model has mlp_bias=True")
    bias = any(getattr(attn, p).bias is not None for p in ("q_proj", "k_proj", "v_proj", "out_proj"))
    return DiffLlamaConfig(vocab_size=model.vocab_size, hidden_size=model.dim, intermediate_size=model.mlp_hidden,
                           num_hidden_layers=model.depth, num_attention_heads=attn.num_heads,
                           num_key_value_heads=attn.num_kv_heads, head_dim=attn.head_dim, hidden_act="silu",
                           max_position_embeddings=model.max_seq_len, rms_norm_eps=eps,
                           tie_word_embeddings=model.tie_embeddings, attention_bias=bias, attention_dropout=0.0,
                           rope_parameters={"rope_type": "default", "rope_theta": float(attn.rotary.base)})


def to_diffllama_state_dict(model: CausalLM, *, fold_norm: bool = False) -> tuple[object, dict]:
    """(``DiffLlamaConfig``, ``DiffLlamaForCausalLM`` state dict) for ``model`` (attention of kind ``"diff"``).

    Needs λ_init = 0.8 − 0.6·exp(−0.3·l) in block l (the attention's ``"lambda_init": "ye"``), one eps for all
    norms and no MLP bias. Sub-norm weights that are not ones raise unless ``fold_norm=True`` (folded into
    ``o_proj``; see :func:`diffattn_to_diffllama_state_dict`).
    """
    from transformers.models.diffllama.modeling_diffllama import lambda_init_fn

    cfg = _diffllama_config(model)
    sd = {"model.embed_tokens.weight": model.tok_embed.weight.detach().clone(),
          "model.norm.weight": model.norm.weight.detach().clone(),
          "lm_head.weight": model.lm_head.weight.detach().clone()}
    for i, blk in enumerate(model.blocks):
        if not math.isclose(blk.attn.lambda_init, lambda_init_fn(i), rel_tol=0.0, abs_tol=1e-12):
            raise ValueError(f"block {i} has lambda_init={blk.attn.lambda_init}, DiffLlama fixes "
                             f"{lambda_init_fn(i)} (build the model with attention={{'kind': 'diff', "
                             f"'lambda_init': 'ye'}})")
        attn_sd = diffattn_to_diffllama_state_dict(
            {k: v.detach() for k, v in blk.attn.state_dict().items()}, num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, fold_norm=fold_norm,
            attention_bias=cfg.attention_bias)
        p = f"model.layers.{i}."
        sd.update({p + "self_attn." + k: v for k, v in attn_sd.items()})
        sd[p + "input_layernorm.weight"] = blk.norm1.weight.detach().clone()
        sd[p + "post_attention_layernorm.weight"] = blk.norm2.weight.detach().clone()
        for name in ("gate_proj", "up_proj", "down_proj"):
            sd[p + f"mlp.{name}.weight"] = getattr(blk.mlp, name).weight.detach().clone()
    return cfg, sd


def to_diffllama(model: CausalLM, *, fold_norm: bool = False) -> nn.Module:
    """An equivalent ``transformers.DiffLlamaForCausalLM`` (same logits, same dtype and device; see
    :func:`to_diffllama_state_dict`)."""
    from transformers import DiffLlamaForCausalLM

    cfg, sd = to_diffllama_state_dict(model, fold_norm=fold_norm)
    hf = DiffLlamaForCausalLM(cfg)
    hf.load_state_dict(sd, strict=True, assign=True)  # assign: the tensors keep the source's dtype
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    return hf.to(model.lm_head.weight.device).train(model.training)


def from_diffllama(hf_model, *, diff_norm_affine: bool = False, backend: str = "auto") -> CausalLM:
    """A ``transformers.DiffLlamaForCausalLM`` (or a folder/repo id to load one from) → an equivalent
    :class:`CausalLM` with ``attention={"kind": "diff", "lambda_init": "ye"}``, sub-norm eps = ``rms_norm_eps`` and no
    sub-norm weight (``diff_norm_affine=True``: a weight of ones, to train it). The result has the source's dtype
    and device (float64 stays float64, bf16 stays bf16)."""
    from transformers import DiffLlamaForCausalLM

    if isinstance(hf_model, (str, os.PathLike)):
        kind = saved_kind(hf_model)
        if kind is not None and "from_diffllama" not in kind[1]:
            raise ValueError(wrong_kind(hf_model, "a transformers DiffLlama checkpoint"))
        hf_model = DiffLlamaForCausalLM.from_pretrained(str(hf_model))
    if not isinstance(hf_model, DiffLlamaForCausalLM):
        raise ValueError(f"hf_model must be a DiffLlamaForCausalLM or a path to one, got {type(hf_model).__name__}")
    c = hf_model.config
    if c.hidden_act != "silu":
        raise ValueError(f"config.hidden_act must be 'silu' (SwiGLU), got {c.hidden_act!r}")
    theta = _diffllama_rope_theta(c)
    attention = AttentionSpec("diff", lambda_init="ye", num_kv_heads=c.num_key_value_heads, rope_theta=theta,
                              sub_norm_eps=c.rms_norm_eps, sub_norm_affine=diff_norm_affine,
                              qkv_bias=bool(c.attention_bias), out_bias=bool(c.attention_bias), backend=backend,
                              causal=True, rope="half")
    model = CausalLM(c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                     mlp_hidden=c.intermediate_size, attention=attention, max_seq_len=c.max_position_embeddings,
                     tie_embeddings=bool(c.tie_word_embeddings), norm_eps=c.rms_norm_eps)
    src = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    sd = {ours: take(src, theirs, "DiffLlamaForCausalLM") for ours, theirs in (
        ("tok_embed.weight", "model.embed_tokens.weight"), ("norm.weight", "model.norm.weight"),
        ("lm_head.weight", "lm_head.weight"))}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        attn = {k[len(p) + 10:]: v for k, v in src.items() if k.startswith(p + "self_attn.")}
        ours = diffllama_to_diffattn_state_dict(attn, num_heads=c.num_attention_heads,
                                                num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                                                diff_norm_affine=diff_norm_affine)
        sd.update({f"blocks.{i}.attn.{k}": v for k, v in ours.items()})
        sd[f"blocks.{i}.norm1.weight"] = take(src, p + "input_layernorm.weight", "DiffLlamaForCausalLM")
        sd[f"blocks.{i}.norm2.weight"] = take(src, p + "post_attention_layernorm.weight", "DiffLlamaForCausalLM")
        for name in ("gate_proj", "up_proj", "down_proj"):
            sd[f"blocks.{i}.mlp.{name}.weight"] = take(src, p + f"mlp.{name}.weight", "DiffLlamaForCausalLM")
    model.load_state_dict(sd, strict=True, assign=True)  # assign: the tensors keep the source's dtype
    if model.tie_embeddings:
        model.lm_head.weight = model.tok_embed.weight
    return model.to(hf_model.lm_head.weight.device).train(hf_model.training)
