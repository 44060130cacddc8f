"""``diffattn inspect`` on Stable Audio 3's DiT: the maps A1, A2 and A1 − A2 of every differential self- and
cross-attention module and head (Stability AI 2026, "Stable Audio 3", arXiv 2605.17991), and their noise numbers.

    diffattn inspect path/to/sa3/transformer --out inspect/ --frames 32 --context-tokens 8 --save-maps

reads a saved diffusers ``StableAudio3DiTModel`` (``save_pretrained``: config.json with ``_class_name``
``"StableAudio3DiTModel"`` and its safetensors; or a pipeline folder whose ``transformer/`` holds one) offline
(``from_pretrained`` on the local folder), runs one deterministic input through it with diffattn's processor
(:func:`~diffattn.adapters.diffusers.capture_stable_audio_maps`), and writes:

- ``summary.json`` (:func:`inspect_stable_audio`): the input it ran (:func:`stable_audio_inputs`), and per module
  (``transformer_blocks.<i>.self_attn`` / ``.cross_attn``) and head, every number a mean over the query rows (the
  memory tokens' and the latents' in self-attention; the latents' and memory tokens' against the context in
  cross-attention):

  - λ = 1 (SA3 subtracts the second map unscaled; the same layout as the other differential models' summaries);
  - ``entropy``: the row entropy of A1 and of A2 (nats), beside log Nk, the entropy of a uniform row;
  - ``negative_mass``: −Σ_k min(A1 − A2, 0) per row, the mass the difference takes away; the rows of A1 − A2 sum
    to 0, so it is also the positive mass and half the L1 distance between the rows of A1 and A2 (0: the two maps
    are equal and the module outputs 0; 1: they attend to disjoint keys);
  - ``sink``: the key that receives the most attention on average, and that mean, for A1, A2 and A1 − A2;
  - self-attention only: ``memory_mass`` (Σ over the memory-token keys, the DiT's learnt sinks, prepended to the
    latents) and ``diagonal_mass`` (A_qq, a token on itself), for A1, A2 and A1 − A2;
  - ``checks``: the rows of A1 and A2 sum to 1, those of A1 − A2 to 0 (the largest error).

- figures (PNG, :mod:`diffattn.diagnostics.plots`), one value per block with the min–max over heads:
  ``self_entropy.png`` / ``cross_entropy.png`` (A1 entropy against the uniform row's), ``self_negative_mass.png`` /
  ``cross_negative_mass.png``, ``memory_mass.png`` (A1 − A2 on the memory tokens, when the DiT has them), and per
  module ``maps/block_XX_self.png`` / ``maps/block_XX_cross.png`` (A1, A2 and A1 − A2, averaged over heads, or of
  one head).
- ``maps.safetensors`` with ``save_maps=True``: every module's A1, A2 and A1 − A2 (``<module>.A1``, ``.A2``,
  ``.combined``; float32, (1, heads, Nq, Nk)).

The input (batch 1, :func:`stable_audio_inputs`): latents (1, io_channels, frames), the context (1, context_tokens,
cond_token_dim) and the global condition (1, global_cond_dim), each N(0, 1) from a generator seeded with ``seed``,
and the timestep t; the widths come from the folder's config.json, the lengths and t from the caller. Every map of
every module is held until the figures are drawn: (memory tokens + frames / patch_size)² per self-attention head.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
import torch.nn as nn

from ..adapters.diffusers import capture_stable_audio_maps
from ..diagnostics import branch_entropy
from ..diagnostics.plots import plot_lambdas, plot_maps
from ..io import atomic_write_file
from ..utils import resolve_device

__all__ = ["STABLE_AUDIO_CLASS", "stable_audio_folder", "stable_audio_inputs", "inspect_stable_audio",
           "inspect_stable_audio_folder"]

#: the ``_class_name`` of the config.json that diffusers' ``save_pretrained`` writes for the DiT
STABLE_AUDIO_CLASS = "StableAudio3DiTModel"

#: safetensors' dtype names of the floating checkpoints ``dtype="auto"`` loads as saved
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def stable_audio_folder(path: str | os.PathLike) -> Path | None:
    """The folder that holds a saved ``StableAudio3DiTModel`` (its config.json names the class): ``path`` itself,
    or the ``transformer/`` folder of a saved pipeline; None for anything else (a missing path included)."""
    path = Path(path).expanduser()
    for folder in (path, path / "transformer"):
        try:
            cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(cfg, dict) and cfg.get("_class_name") == STABLE_AUDIO_CLASS:
            return folder
    return None


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def stable_audio_inputs(config, *, frames: int | None = None, context_tokens: int = 8, timestep: float = 0.5,
                        seed: int = 0, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The DiT's keyword arguments for one deterministic input of batch 1: ``hidden_states`` (1, io_channels,
    frames), ``encoder_hidden_states`` (1, context_tokens, cond_token_dim) and ``global_hidden_states`` (1,
    global_cond_dim), each N(0, 1) drawn in float32 from a CPU generator seeded with ``seed`` (in that order), then
    cast to ``dtype`` on ``device``; ``timestep`` (1,) = t. The widths come from ``config`` (the model's
    ``config``, a mapping); ``frames`` defaults to 16 latent tokens (16 · patch_size frames) and must be a
    multiple of patch_size."""
    patch = int(config["patch_size"])
    frames = 16 * patch if frames is None else _check_int("frames", frames, 1)
    if frames % patch:
        raise ValueError(f"frames must be a multiple of the DiT's patch_size ({patch}), got {frames}")
    _check_int("context_tokens", context_tokens, 1)
    _check_int("seed", seed, 0)
    if isinstance(timestep, bool) or not isinstance(timestep, (int, float)) or not 0.0 <= timestep <= 1.0:
        raise ValueError(f"timestep must be a number in [0, 1], got {timestep!r}")
    g = torch.Generator().manual_seed(seed)
    shapes = {"hidden_states": (1, int(config["io_channels"]), frames),
              "encoder_hidden_states": (1, context_tokens, int(config["cond_token_dim"])),
              "global_hidden_states": (1, int(config["global_cond_dim"]))}
    out = {k: torch.randn(s, generator=g).to(device=device, dtype=dtype) for k, s in shapes.items()}
    out["timestep"] = torch.full((1,), float(timestep), device=device, dtype=dtype)
    return out


def _per_head(t: torch.Tensor) -> list[float]:
    """(B, H, Nq) → the mean over batch and query rows per head."""
    return t.mean(dim=(0, 2)).tolist()


def _sink(a: torch.Tensor) -> dict:
    col = a.mean(dim=(0, 2))  # (H, Nk): the attention each key receives, averaged over the query rows
    mass, key = col.max(dim=-1)
    return {"key": key.tolist(), "mass": mass.tolist()}


def _row(i: int, name: str, w: tuple[torch.Tensor, ...], memory: int) -> dict:
    """summary.json's numbers of one module call, from its maps w = (A1, A2, A1 − A2) (module docstring)."""
    a1, a2, c = (t.double() for t in w)  # (1, H, Nq, Nk)
    heads, nq, nk = c.shape[1:]
    self_attn = name.endswith("self_attn")
    parts = name.split(".")
    maps = {"A1": a1, "A2": a2, "signed": c}
    row = {"name": name, "layer": i, "block": int(parts[-2]) if parts[-2].isdigit() else None,
           "attention": "self" if self_attn else "cross", "kind": "stable_audio", "heads": int(heads),
           "queries": int(nq), "keys": int(nk), "lambda": [1.0] * heads, "lambda_mean": 1.0,
           "entropy": {"A1": branch_entropy(a1).tolist(), "A2": branch_entropy(a2).tolist(),
                       "uniform": math.log(nk)},
           "negative_mass": _per_head((-c.clamp_max(0)).sum(-1)),
           "sink": {k: _sink(a) for k, a in maps.items()}}
    if self_attn:
        if memory:
            row["memory_mass"] = {k: _per_head(a[..., :memory].sum(-1)) for k, a in maps.items()}
        row["diagonal_mass"] = {k: _per_head(a.diagonal(dim1=-2, dim2=-1)) for k, a in maps.items()}
    row["checks"] = {"A1_row_sum_error": float((a1.sum(-1) - 1).abs().max()),
                     "A2_row_sum_error": float((a2.sum(-1) - 1).abs().max()),
                     "combined_row_sum_error": float(c.sum(-1).abs().max())}
    return row


def _mean(rows: list[dict], get) -> float:
    v = [x for r in rows for x in get(r)]
    return sum(v) / len(v) if v else float("nan")


def inspect_stable_audio(model: nn.Module, out: str | os.PathLike, *, frames: int | None = None,
                         context_tokens: int = 8, timestep: float = 0.5, seed: int = 0, backend: str = "auto",
                         head: int | None = None, save_maps: bool = False, plots: bool = True,
                         meta: dict | None = None) -> dict:
    """Run ``model`` (diffusers' ``StableAudio3DiTModel``, differential) on :func:`stable_audio_inputs` with
    diffattn's processor (``backend``; the maps are computed on the side by ``math``) and write ``summary.json``,
    the figures and (``save_maps``) ``maps.safetensors`` under ``out`` (module docstring). ``head``: draw that head
    instead of the mean over heads. Returns the summary dict (what ``summary.json`` holds)."""
    cfg = model.config
    param = next(model.parameters())
    inputs = stable_audio_inputs(cfg, frames=frames, context_tokens=context_tokens, timestep=timestep, seed=seed,
                                 dtype=param.dtype, device=param.device)
    heads = int(cfg["num_heads"])
    if head is not None and (isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < heads):
        raise ValueError(f"head must be in [0, {heads}), got {head!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    memory = int(cfg["num_memory_tokens"])
    model.eval()
    with torch.no_grad(), capture_stable_audio_maps(model, backend=backend) as captured:
        sample = model(**inputs).sample
    calls = [(name, w) for name, ws in captured.items() for w in ws]
    rows = [_row(i, name, w, memory) for i, (name, w) in enumerate(calls)]
    self_rows = [r for r in rows if r["attention"] == "self"]
    cross_rows = [r for r in rows if r["attention"] == "cross"]
    latent_tokens = inputs["hidden_states"].shape[-1] // int(cfg["patch_size"])
    summary = {
        **(meta or {}),
        "model_class": type(model).__name__,
        "dtype": str(param.dtype).removeprefix("torch."),
        "config": {k: cfg[k] for k in ("io_channels", "patch_size", "embed_dim", "depth", "num_heads",
                                       "cond_token_dim", "global_cond_dim", "num_memory_tokens")},
        "input": {"batch": 1, "frames": int(inputs["hidden_states"].shape[-1]), "latent_tokens": latent_tokens,
                  "memory_tokens": memory, "context_tokens": context_tokens, "timestep": float(timestep),
                  "seed": seed, "backend": backend},
        "output": {"abs_mean": float(sample.double().abs().mean()), "finite": bool(torch.isfinite(sample).all())},
        "layers": rows,
        "overall": {
            "lambda_mean": 1.0,
            "self": {"entropy_A1": _mean(self_rows, lambda r: r["entropy"]["A1"]),
                     "entropy_A2": _mean(self_rows, lambda r: r["entropy"]["A2"]),
                     "entropy_uniform": self_rows[0]["entropy"]["uniform"] if self_rows else float("nan"),
                     "negative_mass": _mean(self_rows, lambda r: r["negative_mass"]),
                     "diagonal_mass_signed": _mean(self_rows, lambda r: r["diagonal_mass"]["signed"])},
            "cross": {"entropy_A1": _mean(cross_rows, lambda r: r["entropy"]["A1"]),
                      "entropy_A2": _mean(cross_rows, lambda r: r["entropy"]["A2"]),
                      "entropy_uniform": cross_rows[0]["entropy"]["uniform"] if cross_rows else float("nan"),
                      "negative_mass": _mean(cross_rows, lambda r: r["negative_mass"])},
        },
        "files": {"summary": "summary.json"},
    }
    if memory:
        summary["overall"]["self"]["memory_mass_signed"] = _mean(self_rows, lambda r: r["memory_mass"]["signed"])
    if plots:
        _figures(summary, calls, out, head)
    if save_maps:
        from safetensors.torch import save_file

        tensors = {f"{name}.{key}": t.detach().float().cpu().contiguous()
                   for name, w in calls for key, t in zip(("A1", "A2", "combined"), w)}
        save_file(tensors, str(out / "maps.safetensors"))
        summary["files"]["maps_tensors"] = "maps.safetensors"
    with atomic_write_file(out / "summary.json", "w") as f:
        json.dump(summary, f, indent=1, allow_nan=True)
    return summary


def _figures(summary: dict, calls: list[tuple[str, tuple[torch.Tensor, ...]]], out: Path,
             head: int | None) -> None:
    """The figures of the module docstring, their names added to ``summary["files"]``."""
    rows, files = summary["layers"], summary["files"]
    for part in ("self", "cross"):
        sel = [r for r in rows if r["attention"] == part]
        if not sel:
            continue
        uniform = sel[0]["entropy"]["uniform"]
        name = f"{part}_entropy.png"
        plot_lambdas([r["entropy"]["A1"] for r in sel], out / name, label="A1 row entropy (nats)",
                     title=f"{part}-attention: A1 entropy per block", baseline=0.0,
                     reference=(uniform, f"uniform row (log {sel[0]['keys']} = {uniform:.3f} nats)"))
        files[name.removesuffix(".png")] = name
        name = f"{part}_negative_mass.png"
        plot_lambdas([r["negative_mass"] for r in sel], out / name, label="negative mass of A1 − A2",
                     title=f"{part}-attention: mass A1 − A2 takes away, per block", baseline=0.0)
        files[name.removesuffix(".png")] = name
    mem = [r["memory_mass"]["signed"] for r in rows if "memory_mass" in r]
    if mem:
        plot_lambdas(mem, out / "memory_mass.png", label="A1 − A2 mass on the memory tokens",
                     title="self-attention: signed mass on the memory tokens, per block", baseline=0.0)
        files["memory_mass"] = "memory_mass.png"
    (out / "maps").mkdir(exist_ok=True)
    which = "mean over heads" if head is None else f"head {head}"
    names = []
    for row, (name, w) in zip(rows, calls):
        a1, a2, c = (t if head is None else t[:, head:head + 1] for t in w)
        block = row["block"] if row["block"] is not None else row["layer"]
        path = out / "maps" / f"block_{block:02d}_{row['attention']}.png"
        plot_maps(a1, a2, c, path, title=f"{name}, {which}")
        names.append(f"maps/{path.name}")
    files["maps"] = names


def _checkpoint_dtype(folder: Path) -> torch.dtype | None:
    """The dtype of the first floating tensor of the folder's safetensors files; None when there are none."""
    from safetensors import safe_open

    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                dtype = _SAFETENSORS_DTYPES.get(st.get_slice(key).get_dtype())
                if dtype is not None:
                    return dtype
    return None


def inspect_stable_audio_folder(path: str | os.PathLike, out: str | os.PathLike, *, frames: int | None = None,
                                context_tokens: int = 8, timestep: float = 0.5, seed: int = 0,
                                device: str | None = None, dtype: torch.dtype | None = None,
                                backend: str = "auto", head: int | None = None, save_maps: bool = False,
                                plots: bool = True) -> dict:
    """Load the ``StableAudio3DiTModel`` saved in ``path`` (:func:`stable_audio_folder`) offline, in ``dtype``
    (None: the checkpoint's), on ``device`` (None: cpu), and run :func:`inspect_stable_audio`; writes under
    ``out``."""
    folder = stable_audio_folder(path)
    if folder is None:
        raise ValueError(f"path must be a saved diffusers {STABLE_AUDIO_CLASS} (config.json with _class_name "
                         f"{STABLE_AUDIO_CLASS!r}, or a pipeline folder whose transformer/ holds one), got {path}")
    try:
        from diffusers import StableAudio3DiTModel
    except ImportError as e:
        raise ValueError(f"{folder} is a Stable Audio 3 DiT: inspecting it needs diffusers >= 0.40 (pip install "
                         f"'diffattn[audio]'); importing it failed: {e}") from None
    dtype = dtype or _checkpoint_dtype(folder) or torch.float32
    model = StableAudio3DiTModel.from_pretrained(str(folder), local_files_only=True, torch_dtype=dtype)
    if not model.config["use_differential_attention"]:
        raise ValueError(f"{folder} holds a StableAudio3DiTModel with use_differential_attention=False: it has no "
                         f"A1 and A2 to inspect")
    model = model.to(resolve_device(device, "--device") if device is not None else "cpu")
    meta = {"path": str(Path(path).expanduser()), "family": "stable_audio"}
    return inspect_stable_audio(model, out, frames=frames, context_tokens=context_tokens, timestep=timestep,
                                seed=seed, backend=backend, head=head, save_maps=save_maps, plots=plots, meta=meta)
