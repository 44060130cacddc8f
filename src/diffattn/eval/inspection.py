"""``diffattn inspect``: the attention-noise diagnostics of a released differential-attention decoder in one call.

    diffattn inspect path/to/Motif-2-12.7B --prompt "…long context…" --needle "The code is 4711." \\
        --question "The code is" --out inspect/

loads the model (:func:`diffattn.factory.load_run`: a released Motif folder through
:func:`diffattn.convert.from_motif`, a transformers DiffLlama folder through :func:`diffattn.convert.from_diffllama`,
or any diffattn model folder), builds the input ``prompt[:k] + needle + prompt[k:] + question`` with the needle at
``depth`` (k = round(depth · len(prompt))), runs one forward pass while every attention layer's maps are captured
(:func:`diffattn.diagnostics.capture_attention`), and writes:

- ``summary.json`` (:func:`inspect_model`): per layer its kind (every attention layer of the library: standard,
  diff, gated, diff_v2, grouped; or a retrofitted one), per head λ (Ye et al. 2024, eq. 2; one value per layer for
  Motif and DiffLlama, repeated per signal head; a per-token λ, M-DGSA's 1 − g or the V2's σ(x W), as its mean
  over the tokens, and ``lambda_query`` at the query row), the mean row entropy of the signal map A1 (per signal
  head) and of the noise map A2 (per noise head: a noise head of grouped differential attention, Motif
  Technologies 2025, arXiv 2510.06949, serves r signal heads and is counted once), and the attention mass of the
  last query row (the token that predicts the answer) on the needle's tokens against the rest of the context (Ye
  et al. 2024, §3.4, Table 3), signed (w1 ⊙ A1 − λ ⊙ A2, as the layer applies it to V) and per branch; the
  row-sum checks of the maps (A1 and A2 rows sum to 1; the combined rows to w1 − λ, w1 = g for M-DGSA, else 1).
  Standard attention has one map: A1, which is its combined map, and no λ.
- figures (PNG, :mod:`diffattn.diagnostics.plots`): ``lambda.png`` (λ per layer), ``needle_mass.png`` (signed mass
  on the needle per layer, min–max over heads), ``entropy.png`` (A1 entropy per layer), and per layer
  ``maps/layer_XX.png`` (A1, A2 and A1 − λA2, averaged over heads, or of one signal head and its noise head).
- ``maps.safetensors`` with ``save_maps=True``: every layer's A1, A2 and combined map (float32, all heads).

Only one layer's full maps are held at a time (the capture is reduced as each layer runs), so a long prompt on a
large model costs the maps of one layer, plus one N × N map per layer for the figures.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn as nn

from ..diagnostics import branch_entropy, capture_attention
from ..diagnostics.plots import plot_lambdas, plot_maps
from ..factory import load_run, run_source
from ..formats import is_diffattn_config
from ..io import atomic_write_file
from ..utils import resolve_device
from .text_models import Tokenizer, get_text_tokenizer, recorded_tokenizer

__all__ = ["inspect_model", "inspect_folder", "build_needle_input", "DTYPES"]

DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def build_needle_input(prompt: Sequence[int], needle: Sequence[int], question: Sequence[int] = (), *,
                       depth: float = 0.5, keep_prefix: int = 0) -> tuple[list[int], tuple[int, int]]:
    """``prompt[:k] + needle + prompt[k:] + question`` with k = round(depth · len(prompt)), at least ``keep_prefix``
    (a BOS token stays first); returns (token ids, (start, end) of the needle span)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    if not len(needle):
        raise ValueError("the needle must hold at least one token")
    prompt, needle, question = list(prompt), list(needle), list(question)
    k = min(len(prompt), max(min(keep_prefix, len(prompt)), round(depth * len(prompt))))
    ids = prompt[:k] + needle + prompt[k:] + question
    return ids, (k, k + len(needle))


class _Reducer(list):
    """Stands in for :attr:`AttentionCapture.layers`: each captured call is reduced to its numbers as it arrives
    (so only one layer's full maps live at a time), keeping a head-averaged (or one head's) map for the figures."""

    def __init__(self, *, needle: tuple[int, int], head: int | None = None, save_maps: bool = False,
                 query: int = -1):
        super().__init__()
        self.needle, self.head, self.save_maps, self.query = needle, head, save_maps, query
        self.rows: list[dict] = []
        self.figures: list[tuple] = []
        self.tensors: dict[str, torch.Tensor] = {}

    def append(self, m) -> None:  # the one list method AttentionCapture calls
        i = len(self.rows)
        # A1 and A1 − λA2 (B, H_s, N, N); A2 (B, H_n, N, N), one map per noise head: signal head i reads i // r
        a1, noise, c = m.first, m.second, m.combined
        r = 1 if noise is None else c.shape[1] // noise.shape[1]
        n = c.shape[-1]
        s, e = self.needle
        needle_keys = torch.zeros(n, dtype=torch.bool)
        needle_keys[s:e] = True
        q = self.query % n

        def mass(a):  # (heads,) mass of the query row on the needle, and on the rest of the context
            row = a[0, :, q].double()  # (heads, N)
            return row[:, needle_keys].sum(-1), row[:, ~needle_keys].sum(-1)

        row = {"name": m.name, "layer": i, "kind": m.kind, "signal_heads": int(c.shape[1]),
               "noise_heads": None if noise is None else int(noise.shape[1]), "group_ratio": r}
        lam = _per_head_token(m.lambda_, c.shape[1])  # (H_s, 1 | N) or None
        if lam is not None:
            lam_l = lam.mean(-1).tolist()  # per head; a per-token λ (M-DGSA's 1 − g, V2's σ(x W)) over the tokens
            row["lambda"] = lam_l
            row["lambda_mean"] = sum(lam_l) / len(lam_l)
            if lam.shape[-1] > 1:
                row["lambda_query"] = lam[:, q].tolist()  # the λ that weighs the query row's needle mass
        elif m.lambda_ is not None:  # a layout of λ other than per head (a retrofit's): as recorded
            lam_l = m.lambda_.double().flatten().tolist()
            row["lambda"], row["lambda_mean"] = lam_l, sum(lam_l) / len(lam_l)
        row["entropy"] = {"A1": branch_entropy(a1).tolist()} if a1 is not None else {}
        if noise is not None:
            row["entropy"]["A2"] = branch_entropy(noise).tolist()
        row["entropy"]["uniform_causal"] = sum(math.log(j + 1) for j in range(n)) / n  # log of the keys seen, mean
        nm, rest = mass(c)
        row["needle_mass"] = {"signed": nm.tolist()}
        row["context_mass"] = {"signed": rest.tolist()}
        if a1 is not None:
            nm, rest = mass(a1)
            row["needle_mass"]["A1"], row["context_mass"]["A1"] = nm.tolist(), rest.tolist()
        if noise is not None:
            nm, rest = mass(noise)
            row["needle_mass"]["A2"], row["context_mass"]["A2"] = nm.tolist(), rest.tolist()
        checks = {}
        if a1 is not None:
            checks["A1_row_sum_error"] = float((a1.double().sum(-1) - 1).abs().max())
        if noise is not None:
            checks["A2_row_sum_error"] = float((noise.double().sum(-1) - 1).abs().max())
            if lam is not None:  # rows of w1 ⊙ A1 − λ ⊙ A2 sum to w1 − λ (w1 = g for M-DGSA, else 1)
                gate = _per_head_token(m.gate, c.shape[1])
                want = (1.0 if gate is None else gate) - lam  # (H_s, 1 | N)
                checks["combined_row_sum_error"] = float((c[0].double().sum(-1) - want).abs().max())
        row["checks"] = checks
        self.rows.append(row)
        h = self.head
        pick = (lambda a, hh: a[:, hh:hh + 1]) if h is not None else (lambda a, hh: a)
        self.figures.append((m.name, None if a1 is None else pick(a1, h).mean(dim=(0, 1)),
                             None if noise is None else pick(noise, None if h is None else h // r).mean(dim=(0, 1)),
                             pick(c, h).mean(dim=(0, 1))))
        if self.save_maps:
            for key, t in (("A1", a1), ("A2", noise), ("combined", c)):
                if t is not None:  # one map (standard attention): A1 is the combined map, stored once each
                    shared = key == "combined" and noise is None
                    self.tensors[f"{m.name}.{key}"] = t.clone() if shared else t.contiguous()

    def __len__(self) -> int:
        return len(self.rows)


def _per_head_token(w: torch.Tensor | None, heads: int) -> torch.Tensor | None:
    """λ or the gate as captured, (heads,) or broadcastable to (1, heads, N, 1), as float64 (heads, 1 | N); None
    for None or another layout."""
    if w is None:
        return None
    w = w.double()
    w = w.reshape(-1, 1) if w.dim() <= 1 else w.reshape(-1, *w.shape[-3:])[0, :, :, 0]
    return w.expand(heads, w.shape[-1]) if w.shape[0] in (1, heads) else None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def inspect_model(model: nn.Module, ids: Sequence[int], out: str | os.PathLike, *, needle: tuple[int, int],
                  tokens: Sequence[str] | None = None, head: int | None = None, save_maps: bool = False,
                  plots: bool = True, meta: dict | None = None) -> dict:
    """Capture every attention layer of ``model`` on one sequence ``ids`` and write ``summary.json``, the figures
    and (``save_maps``) ``maps.safetensors`` under ``out`` (module docstring). ``needle`` = (start, end) of the needle
    span among the key positions; the query row is the last token. ``head``: plot that signal head (and its noise
    head) instead of the mean over heads. Returns the summary dict (what ``summary.json`` holds)."""
    ids = [int(t) for t in ids]
    s, e = needle
    if not 0 <= s < e <= len(ids):
        raise ValueError(f"needle span ({s}, {e}) must lie inside the {len(ids)} tokens")
    if e == len(ids):
        raise ValueError("the needle must come before the last token, the query row that reads it")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    param = next(model.parameters())
    x = torch.tensor([ids], dtype=torch.long, device=param.device)
    red = _Reducer(needle=(s, e), head=head, save_maps=save_maps)
    model.eval()
    with torch.no_grad(), capture_attention(model) as cap:
        cap.layers = red
        logits = model(x)
    if not red.rows:
        raise ValueError(f"{type(model).__name__} ran no attention layer that diffattn can capture")
    if head is not None and not 0 <= head < red.rows[0]["signal_heads"]:
        raise ValueError(f"head must be in [0, {red.rows[0]['signal_heads']}), got {head}")
    logits = logits[0] if isinstance(logits, torch.Tensor) else logits.logits[0]
    top = int(logits[-1].float().argmax())
    rows = red.rows
    signed = [_mean(r["needle_mass"]["signed"]) for r in rows]
    rest = [_mean(r["context_mass"]["signed"]) for r in rows]
    summary = {
        **(meta or {}),
        "model_class": type(model).__name__,
        "dtype": str(param.dtype).removeprefix("torch."),
        "num_tokens": len(ids), "ids": ids, "tokens": list(tokens) if tokens is not None else None,
        "needle": {"start": s, "end": e, "query": len(ids) - 1},
        "next_token": top,
        "layers": rows,
        "overall": {
            "lambda_mean": _mean([r["lambda_mean"] for r in rows if "lambda_mean" in r]),
            "needle_mass_signed": _mean(signed), "context_mass_signed": _mean(rest),
            "needle_to_context_ratio": _mean(signed) / _mean(rest) if _mean(rest) else float("inf"),
            "needle_tokens": e - s, "context_tokens": len(ids) - (e - s),
        },
        "files": {"summary": "summary.json"},
    }
    if plots:
        lam_layers = [r["lambda"] for r in rows if "lambda" in r]
        if lam_layers:
            plot_lambdas(lam_layers, out / "lambda.png", title="λ per layer")
            summary["files"]["lambda"] = "lambda.png"
        n_keys = len(ids)
        plot_lambdas([r["needle_mass"]["signed"] for r in rows], out / "needle_mass.png",
                     label="signed mass on the needle", title=f"last query → needle tokens {s}..{e - 1} (A1 − λA2)",
                     baseline=0.0, reference=((e - s) / n_keys, f"uniform: {e - s}/{n_keys} of the keys"))
        summary["files"]["needle_mass"] = "needle_mass.png"
        if all("A1" in r["entropy"] for r in rows):
            uniform = rows[0]["entropy"]["uniform_causal"]
            plot_lambdas([r["entropy"]["A1"] for r in rows], out / "entropy.png", label="A1 row entropy (nats)",
                         title="signal-map entropy per layer", baseline=0.0,
                         reference=(uniform, f"uniform causal map ({uniform:.3f} nats)"))
            summary["files"]["entropy"] = "entropy.png"
        (out / "maps").mkdir(exist_ok=True)
        names = []
        which = "mean over heads" if head is None else f"signal head {head}"
        for i, (name, a1, a2, c) in enumerate(red.figures):
            path = out / "maps" / f"layer_{i:02d}.png"
            plot_maps(a1 if a1 is not None else c, a2, c, path, title=f"layer {i} ({name}), {which}",
                      tokens=tokens)
            names.append(f"maps/{path.name}")
        summary["files"]["maps"] = names
    if save_maps:
        from safetensors.torch import save_file

        save_file(red.tensors, str(out / "maps.safetensors"))
        summary["files"]["maps_tensors"] = "maps.safetensors"
    with atomic_write_file(out / "summary.json", "w") as f:
        json.dump(summary, f, indent=1, allow_nan=True)
    return summary


def _tokenizer(path: Path, tokenizer: str | None) -> Tokenizer:
    """``tokenizer`` (``bytes``, ``gpt2``, a folder or a Hub id), else the one the folder records
    (:func:`~diffattn.eval.text_models.recorded_tokenizer`: its run's ``config.yaml``, or the folder's own tokenizer
    files); one line when there is none or it fails to load."""
    spec = tokenizer or recorded_tokenizer(path)
    if spec is None:
        raise ValueError(f"{path} has no tokenizer (tokenizer.json / tokenizer_config.json, or a run's config.yaml "
                         f"naming one): give --tokenizer (bytes, gpt2, a folder), or token ids with --ids and "
                         f"--needle-ids")
    return get_text_tokenizer(spec)


def _family(model: nn.Module, path: Path) -> str:
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    if is_diffattn_config(cfg):  # a diffattn save (a causal LM's also has model_type "diffattn"): its class
        return type(model).__name__
    return str(cfg.get("model_type") or type(model).__name__)


def inspect_folder(path: str | os.PathLike, out: str | os.PathLike, *, prompt: str | None = None,
                   needle: str | None = None, question: str | None = None, ids: Sequence[int] | None = None,
                   needle_ids: Sequence[int] | None = None, question_ids: Sequence[int] = (), depth: float = 0.5,
                   tokenizer: str | None = None, device: str | None = None, dtype: str = "auto",
                   backend: str = "auto", head: int | None = None, save_maps: bool = False,
                   plots: bool = True) -> dict:
    """Load ``path`` (:func:`~diffattn.factory.load_run`), build the needle input from text (``tokenizer``, else the
    one the folder records: its run's ``config.yaml`` or its tokenizer files) or from token ids, and run
    :func:`inspect_model`; writes under ``out``."""
    run_source(path)  # a missing path is one line naming it and the closest names beside it, before any work
    path = Path(path).expanduser()
    if (prompt is None) == (ids is None):
        raise ValueError("give the context either as text (--prompt, with --needle) or as token ids (--ids, with "
                         "--needle-ids)")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    tok = None
    if prompt is not None:
        if needle is None:
            raise ValueError("--prompt needs --needle, the text placed in it whose attention mass is measured")
        tok = _tokenizer(path, tokenizer)
        hf = tok.hf  # a transformers tokenizer adds its BOS to the prompt, as the model saw text in training
        p_ids = hf(prompt, add_special_tokens=True)["input_ids"] if hf is not None else tok.encode(prompt)
        n_ids, q_ids = tok.encode(needle), tok.encode(question) if question else []
        prefix = 1 if getattr(hf, "bos_token_id", None) is not None and p_ids[:1] == [hf.bos_token_id] else 0
    else:
        if not needle_ids:
            raise ValueError("--ids needs --needle-ids, the token ids placed in it whose attention mass is measured")
        p_ids, n_ids, q_ids, prefix = list(ids), list(needle_ids), list(question_ids), 0
    seq, span = build_needle_input(p_ids, n_ids, q_ids, depth=depth, keep_prefix=prefix)
    model = load_run(path, backend=backend)  # released Motif / DiffLlama, a diffattn save or run, a retrofit run
    vocab = getattr(model, "vocab_size", None)
    if vocab is not None and max(seq) >= vocab:
        raise ValueError(f"token id {max(seq)} is outside the model's vocabulary ({vocab} tokens)")
    if DTYPES[dtype] is not None:
        model = model.to(DTYPES[dtype])
    model = model.to(resolve_device(device, "--device") if device is not None else "cpu")
    tokens = tok.pieces(seq) if tok is not None else None
    meta = {"path": str(path), "family": _family(model, path), "depth": depth}
    return inspect_model(model, seq, out, needle=span, tokens=tokens, head=head, save_maps=save_maps, plots=plots,
                         meta=meta)
