"""The released Motif checkpoints ↔ :class:`~diffattn.models.motif.MotifLM`, exactly, both ways.

Motif-2.6B (Motif Technologies 2025, arXiv 2508.09148) is differential attention (Ye et al. 2024) in a Llama-style
decoder with a PolyNorm MLP; Motif-2-12.7B (Motif Technologies 2025, arXiv 2511.07464) replaces it with grouped
differential attention (GDA, arXiv 2510.06949: ``num_noise_heads`` noise heads, each shared by a group of signal
heads). The layout read and written here is the one the public model code loads (vLLM's
``vllm/model_executor/models/motif.py`` and ``vllm/v1/attention/backends/grouped_diff_attn.py``):

- ``config.json``: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads`` (signal + noise query heads),
  ``num_noise_heads`` (GDA; default half the heads), ``num_key_value_heads``, ``head_dim``, ``intermediate_size``,
  ``vocab_size``, ``hidden_act`` (``"poly_norm"``), ``rms_norm_eps``, ``attn_rms_norm_eps`` (the sub-norm),
  ``rope_theta`` (plain rotate-half RoPE: ``rope_scaling`` must be unset), ``max_position_embeddings``,
  ``tie_word_embeddings`` (transformers' default, True, when absent), ``attention_bias`` / ``use_bias`` /
  ``qkv_bias`` (o_proj has a bias if either of the first two is set; q/k/v follow ``qkv_bias`` whenever the key is
  present, ``null`` meaning no bias, and the first two otherwise, as vLLM's ``hasattr(config, "qkv_bias")`` reads
  it; the MLP ``use_bias``). ``k_ratio``, which that code does not read (its key heads are signal/noise pairs and
  ``num_noise_heads`` alone sets the grouping), must be absent or ``null``: any value is refused, never ignored.
- tensors: ``model.embed_tokens.weight``, ``model.norm.weight``, ``lm_head.weight`` (absent when tied), and per
  layer ``model.layers.{i}.`` + ``self_attn.{q,k,v,o}_proj.{weight,bias}``, ``self_attn.lambda_{q1,k1,q2,k2}``,
  ``self_attn.subln.weight``, ``mlp.{gate,up,down}_proj.{weight,bias}``, ``mlp.act_fn.{weight,bias}`` (PolyNorm),
  ``input_layernorm.weight``, ``post_attention_layernorm.weight``.

The head layouts are diffattn's own, so no tensor is permuted: query heads come in groups of r + 1 ([signal × r,
noise]; for Motif-2.6B the adjacent pairs of :class:`~diffattn.layers.DiffAttention`), key heads 2m / 2m + 1 are the
signal / noise keys and value heads (2m, 2m + 1) one value of width 2d. λ_init is the released schedule
0.8 − 0.6·exp(−0.3·(l − 1)) (``lambda_init="motif"``; it counts layers from −1, so layer 0 gets ≈ −0.0099), kept as
released. Tensors keep their dtype; a converted state dict written back is bit-identical.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import torch

from ..formats import saved_kind, wrong_kind
from ..io import atomic_write_dir
from ..lambdas import lambda_init_motif
from ..layers import GroupedDiffAttention
from ..models.base import check_state_dict
from ..models.motif import MOTIF_ATTENTION, MotifLM
from ._common import LAMBDAS, StateDict, check_no_extra, take

__all__ = ["MOTIF_ARCHITECTURE", "motif_kwargs", "motif_name_map", "motif_to_diffattn_state_dict",
           "diffattn_to_motif_state_dict", "motif_config", "from_motif", "to_motif", "read_motif"]

MOTIF_ARCHITECTURE = "MotifForCausalLM"
_POLY_NORM_EPS = 1e-6  # PolyNorm's eps in the released code (not in config.json)

# (released name under model.layers.{i}., diffattn name under blocks.{i}.); ".weight"/".bias" where the tensor has one
_LAYER_NAMES = [(f"self_attn.{a}_proj", f"attn.{b}_proj") for a, b in (("q", "q"), ("k", "k"), ("v", "v"),
                                                                         ("o", "out"))]
_LAYER_NAMES += [(f"mlp.{p}", f"mlp.{p}") for p in ("gate_proj", "up_proj", "down_proj", "act_fn")]
_LAYER_NAMES += [("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2"), ("self_attn.subln",
                                                                                         "attn.diff_norm")]
_TOP_NAMES = [("model.embed_tokens.weight", "tok_embed.weight"), ("model.norm.weight", "norm.weight"),
              ("lm_head.weight", "lm_head.weight")]


def motif_name_map(depth: int) -> dict[str, str]:
    """Released tensor name → diffattn name (:class:`MotifLM`'s), every tensor a Motif model of ``depth`` layers can
    hold (biases included); what a server reading the released files streams them through (:mod:`diffattn.serve`)."""
    out = dict(_TOP_NAMES)
    for i in range(depth):
        p, q = f"model.layers.{i}.", f"blocks.{i}."
        for theirs, ours in _LAYER_NAMES:
            for kind in ("weight", "bias"):
                out[f"{p}{theirs}.{kind}"] = f"{q}{ours}.{kind}"
        out.update({f"{p}self_attn.{n}": f"{q}attn.{n}" for n in LAMBDAS})
    return out


def _get(cfg: dict, key: str, default=None, *, required: bool = False):
    if key not in cfg or cfg[key] is None:
        if required:
            raise ValueError(f"Motif config.json has no {key!r}")
        return default
    return cfg[key]


def motif_kwargs(config: dict, backend: str = "auto") -> dict:
    """The :class:`MotifLM` arguments of a released ``config.json`` (a dict), its ``attention`` spec dict with the
    attention ``backend``; ValueError for a setting MotifLM cannot compute exactly (another activation, scaled RoPE,
    partial rotary, bidirectional attention)."""
    if not isinstance(config, dict):
        raise ValueError(f"config must be the dict of a Motif config.json, got {type(config).__name__}")
    act = _get(config, "hidden_act", "poly_norm")
    if act != "poly_norm":
        raise ValueError(f"config.hidden_act must be 'poly_norm' (Motif's MLP), got {act!r}")
    if _get(config, "rope_scaling") not in (None, {}) and config["rope_scaling"].get("rope_type", config[
            "rope_scaling"].get("type")) != "default":
        raise ValueError(f"config.rope_scaling={config['rope_scaling']!r}: diffattn's rotary embedding has no scaled "
                         f"variants; only plain RoPE converts exactly")
    if float(_get(config, "partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"config.partial_rotary_factor={config['partial_rotary_factor']} is not supported (1 only)")
    if not _get(config, "is_causal", True) or _get(config, "use_sliding_window", False):
        raise ValueError("config asks for bidirectional or sliding-window attention; Motif decoders are causal "
                         "with full attention and only that converts")
    h = int(_get(config, "num_attention_heads", required=True))
    dim = int(_get(config, "hidden_size", required=True))
    attention_bias = bool(_get(config, "attention_bias", False)) or bool(_get(config, "use_bias", False))
    # vLLM's MotifDecoderLayer: ``if hasattr(config, "qkv_bias"): bias = config.qkv_bias``: a null key is no bias
    qkv_bias = bool(config["qkv_bias"]) if "qkv_bias" in config else attention_bias
    if _get(config, "k_ratio") is not None:  # said, never ignored silently; computed as vLLM serves the folder
        warnings.warn(f"config.k_ratio={config['k_ratio']!r} is not read: the public Motif model code (vLLM's "
                      f"MotifForCausalLM) has no k_ratio, its key heads come in signal/noise pairs and "
                      f"num_noise_heads alone sets the grouping; the model is built as that code computes it",
                      UserWarning, stacklevel=2)
    noise, width = int(_get(config, "num_noise_heads", h // 2)), int(_get(config, "head_dim", dim // h))
    grouped = 2 * noise != h or width * h != dim  # else differential attention (Motif-2.6B)
    attention = {"kind": "grouped" if grouped else "diff", **MOTIF_ATTENTION}
    attention.update(num_kv_heads=int(_get(config, "num_key_value_heads", h)),
                     qkv_bias=qkv_bias, out_bias=attention_bias,
                     sub_norm_eps=float(_get(config, "attn_rms_norm_eps", required=True)),
                     rope_theta=float(_get(config, "rope_theta", 10000.0)), causal=True, rope="half", backend=backend,
                     **(dict(num_noise_heads=noise, head_dim=width) if grouped else {}))
    return dict(vocab_size=int(_get(config, "vocab_size", required=True)), dim=dim,
                depth=int(_get(config, "num_hidden_layers", required=True)), num_heads=h, attention=attention,
                mlp_hidden=int(_get(config, "intermediate_size", required=True)),
                max_seq_len=int(_get(config, "max_position_embeddings", 8192)),
                tie_embeddings=bool(_get(config, "tie_word_embeddings", True)),
                norm_eps=float(_get(config, "rms_norm_eps", required=True)),
                poly_norm_eps=_POLY_NORM_EPS, mlp_bias=bool(_get(config, "use_bias", False)))


def motif_to_diffattn_state_dict(sd: StateDict, depth: int, *, tie_embeddings: bool) -> dict[str, torch.Tensor]:
    """Released tensor names → :class:`MotifLM` names (tensors shared, not copied). ``rotary_emb.inv_freq`` buffers
    are dropped; a tied ``lm_head.weight`` may be absent or equal to the embedding; any other key is an error."""
    names = motif_name_map(depth)
    src = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}
    if tie_embeddings and "lm_head.weight" in src:
        if not torch.equal(src["lm_head.weight"], src["model.embed_tokens.weight"]):
            raise ValueError("tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight")
        src.pop("lm_head.weight")
    check_no_extra(src, set(names), "Motif checkpoint")
    for required in ("model.embed_tokens.weight", "model.norm.weight") + (() if tie_embeddings else
                                                                            ("lm_head.weight",)):
        take(src, required, "Motif checkpoint")
    return {names[k]: v for k, v in src.items()}


def read_motif(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, state dict) of a released Motif folder: ``config.json`` and ``model.safetensors`` or the shards
    named by ``model.safetensors.index.json``. Reads safetensors only (no pickle, no code)."""
    from safetensors.torch import load_file

    p = Path(path).expanduser()
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{p} has no config.json; a Motif checkpoint folder holds config.json and "
                                f"*.safetensors")
    config = json.loads(cfg_file.read_text(encoding="utf-8"))
    index = p / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    elif (p / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{p} has neither model.safetensors nor model.safetensors.index.json")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(p / f)))
    return config, sd


def _is_motif_type(model_type) -> bool:
    """Whether a ``model_type`` names Motif: the released files say "Motif", :func:`to_motif` keeps that spelling
    and writes "motif" where there is none."""
    return isinstance(model_type, str) and model_type.lower() == "motif"


def _is_motif(config: dict) -> bool:
    names = config.get("architectures") or []
    return _is_motif_type(config.get("model_type")) or any(isinstance(n, str) and n.startswith("Motif")
                                                           for n in names)


def from_motif(source, *, config: dict | None = None, backend: str = "auto") -> MotifLM:
    """A released Motif checkpoint → an equivalent :class:`MotifLM`, in the checkpoint's dtype.

    ``source``: a folder (``config.json`` + safetensors, :func:`read_motif`), or a state dict with the ``config``
    dict beside it. Motif-2.6B gives :class:`~diffattn.layers.DiffAttention` layers, Motif-2-12.7B (``num_noise_heads``
    below half the heads) :class:`~diffattn.layers.GroupedDiffAttention`; λ_init is the released schedule
    (:func:`~diffattn.lambdas.lambda_init_motif`)."""
    if isinstance(source, (str, os.PathLike)):
        if config is not None:
            raise ValueError("config= goes with a state dict; a folder's config.json is read from the folder")
        kind = saved_kind(source)
        if kind is not None and "from_motif" not in kind[1]:
            raise ValueError(wrong_kind(source, "a Motif checkpoint"))
        config, sd = read_motif(source)
    elif isinstance(source, dict):
        if config is None:
            raise ValueError("a state dict needs config= (the dict of the checkpoint's config.json)")
        sd = source
    else:
        raise ValueError(f"source must be a Motif folder or a state dict, got {type(source).__name__}")
    if not _is_motif(config):
        raise ValueError(f"config is not a Motif config (model_type {config.get('model_type')!r}, architectures "
                         f"{config.get('architectures')!r})")
    kwargs = motif_kwargs(config, backend)
    ours = motif_to_diffattn_state_dict(sd, kwargs["depth"], tie_embeddings=kwargs["tie_embeddings"])
    with torch.device("meta"):  # shapes only: every tensor comes from the checkpoint
        model = MotifLM(**kwargs)
    check_state_dict(model, ours, "Motif checkpoint")  # ValueError naming every missing or mis-shaped tensor
    if model.tie_embeddings:
        ours["lm_head.weight"] = ours["tok_embed.weight"]
    model.load_state_dict(ours, strict=True, assign=True)  # assign: the tensors keep the checkpoint's dtype
    if model.tie_embeddings:
        model.lm_head.weight = model.tok_embed.weight
    model.model_name = config.get("_name_or_path") or None
    return model.eval()


def motif_config(model: MotifLM, base: dict | None = None) -> dict:
    """The released ``config.json`` of ``model`` (``base``'s other entries kept, e.g. token ids, and its spelling of
    ``model_type``, "Motif" or "motif", and of a ``null`` ``qkv_bias``); ValueError for
    what the released code cannot express (its λ_init schedule, PolyNorm eps, bias flags, λ form, norms)."""
    if not isinstance(model, MotifLM):
        raise ValueError(f"model must be a MotifLM, got {type(model).__name__}")
    blk = model.blocks[0]
    attn = blk.attn
    qkv_bias, out_bias = attn.q_proj.bias is not None, attn.out_proj.bias is not None
    mlp_bias = blk.mlp.gate_proj.bias is not None
    if mlp_bias and not out_bias:
        raise ValueError("Motif's use_bias sets the MLP and o_proj biases together; the model has an MLP bias "
                         "without an o_proj bias")
    for i, b in enumerate(model.blocks):
        a = b.attn
        if not math.isclose(a.lambda_init, lambda_init_motif(i), rel_tol=0.0, abs_tol=1e-12):
            raise ValueError(f"block {i} has lambda_init={a.lambda_init}; Motif derives λ_init from the layer index "
                             f"({lambda_init_motif(i)}): build the model with its default attention (MOTIF_ATTENTION: "
                             f"'lambda_init': 'motif')")
        if a.lambda_form != "reparam" or a.lambda_q1.dim() != 1:
            raise ValueError(f"block {i}: Motif has one reparam λ per layer, got lambda_form={a.lambda_form!r}")
        if getattr(a.diff_norm, "weight", None) is None:
            raise ValueError(f"block {i}: Motif's sub-norm (subln) has a weight; the model's has none")
        if b.mlp.act_fn.eps != _POLY_NORM_EPS:
            raise ValueError(f"block {i}: PolyNorm eps is {b.mlp.act_fn.eps}, the released code fixes {_POLY_NORM_EPS}")
    grouped = isinstance(attn, GroupedDiffAttention)
    cfg = dict(base or {})
    model_type = cfg["model_type"] if _is_motif_type(cfg.get("model_type")) else "motif"  # "Motif" stays "Motif"
    cfg.update({"architectures": [MOTIF_ARCHITECTURE], "model_type": model_type, "vocab_size": model.vocab_size,
                "hidden_size": model.dim, "intermediate_size": model.mlp_hidden, "num_hidden_layers": model.depth,
                "num_attention_heads": attn.num_heads, "num_key_value_heads": attn.num_kv_heads,
                "hidden_act": "poly_norm", "rms_norm_eps": blk.norm1.eps, "attn_rms_norm_eps": attn.diff_norm.eps,
                "rope_theta": float(attn.rotary.base), "rope_scaling": None,
                "max_position_embeddings": model.max_seq_len, "tie_word_embeddings": model.tie_embeddings,
                "attention_bias": out_bias, "use_bias": mlp_bias,
                "qkv_bias": None if cfg.get("qkv_bias", False) is None and not qkv_bias else qkv_bias})
    if grouped or "num_noise_heads" in cfg or "head_dim" in cfg:
        cfg["num_noise_heads"] = attn.num_noise_heads if grouped else attn.num_heads // 2
        cfg["head_dim"] = attn.head_dim
    return cfg


def diffattn_to_motif_state_dict(model: MotifLM) -> dict[str, torch.Tensor]:
    """:class:`MotifLM` tensors under their released names (detached clones; ``lm_head.weight`` left out when tied)."""
    inverse = {ours: theirs for theirs, ours in motif_name_map(model.depth).items()}
    sd = model.state_dict()
    if model.tie_embeddings:
        sd.pop("lm_head.weight", None)
    missing = sorted(k for k in sd if k not in inverse)
    if missing:
        raise ValueError(f"MotifLM tensors with no released name: {missing[:8]}")
    return {inverse[k]: v.detach().clone() for k, v in sd.items()}


def to_motif(model: MotifLM, path: str | os.PathLike | None = None, *,
             base_config: dict | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, state dict) of ``model`` in the released layout (:func:`motif_config`,
    :func:`diffattn_to_motif_state_dict`); with ``path``, also written there as ``config.json`` and
    ``model.safetensors`` (a folder :func:`from_motif` and the released model code read)."""
    cfg = motif_config(model, base_config)
    sd = diffattn_to_motif_state_dict(model)
    if path is not None:
        from safetensors.torch import save_file

        with atomic_write_dir(path) as tmp:
            save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(tmp, "model.safetensors"),
                      metadata={"format": "pt"})
            with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
                json.dump(cfg, f, indent=2)
    return cfg, sd
