"""Precision of the differential subtraction: diffattn's operator against the two-call recipe, per attention kind,
CPU backend and dtype, as the two maps become alike.

    O = w1 ⊙ (A1 V) − λ ⊙ (A2 V),   A_b = softmax(Q_b K_bᵀ / √d)            (Ye et al. 2024, eq. 1)

When A1 ≈ A2 and λ ≈ w1 the two terms cancel: ‖O‖ is much smaller than ‖w1 ⊙ A1 V‖, and any error made in the
terms before the subtraction is an error of ‖w1 ⊙ A1 V‖'s size in a result of ‖O‖'s size (Higham 2002, "Accuracy
and Stability of Numerical Algorithms", §1.7). The maps are made alike on purpose: q2 = q1 + ε·noise and
k2 = k1 + ε·noise for ε ∈ {1, 0.1, 0.01, 0.001, 0}, λ ∈ {0.2, 0.8, 1}.

Per kind of :data:`diffattn.layers.ATTENTION_TYPES` (the operator call its layer makes, with its λ form's shape):

- ``diff`` (reparam λ: one 0-D float32 tensor per layer; head pairs, values of width 2d): ``diff_attention_pairs``;
- ``gated`` (M-DGSA: w1 = g, λ = 1 − g per token and head): g = 1 / (1 + λ), so that λ / w1 is the swept λ;
- ``diff_v2`` (one K for both branches, so only q2 moves; λ per token and head; values of width d; 2 key/value
  heads for 4 differential heads): ``diff_attention_pairs(k_paired=False)``;
- ``grouped`` (GDA: 4 signal heads, 2 noise heads each serving 2 of them, one key/value head pair; 0-D λ):
  ``diff_attention`` with each noise query given once per signal head;
- ``stable_audio`` (w1 = λ = 1, no other λ; values of width d): ``diff_attention``, λ = 1 only.

Each runs through every CPU path of the operator: ``math`` (the maps in float32, combined, one product by V),
``sdpa`` (one fused call per branch, combined after; bfloat16/float16 inputs run both calls on float32 copies),
``decode`` (what ``auto`` takes for ≤ 16 query rows against more keys: the last 8 query rows here) and
``blockwise`` (the ``sdpa`` backend's CPU training path, float32 and float64 only, so float32 here); and the
two-call recipe of diffusers' processors: ``F.scaled_dot_product_attention`` per branch in the working dtype,
w1 ⊙ O1 − λ ⊙ O2 in the working dtype. Inputs are drawn in float32, rounded to the dtype, and the reference is the
float64 ``math`` operator on those rounded inputs, so only the computation's error is measured.

Reported per case: ``err`` = max |O − O_ref|; relative to the output's scale, err / max |O_ref|; relative to the
cancelled term, err / max |w1 ⊙ A1 V|; and ``bound factor`` = err / :func:`bound`, where
bound = u · max |O_ref| + √Nk · u32 · max |w1 ⊙ A1 V| (u the dtype's unit roundoff, eps / 2; u32 float32's): the
contract diffattn's paths keep within a factor of a few (``tests/test_ops_precision.py`` holds it at 8), which the
two-call recipe breaks by two orders of magnitude when λ ≈ w1 and the maps are alike.

    python benchmarks/precision.py --markdown docs/reliability.md      # about a minute on one thread
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from diffattn.layers import ATTENTION_TYPES
from diffattn.ops import decode_diff_attention, diff_attention, diff_attention_pairs
from diffattn.ops.blockwise import blockwise_diff_attention
from diffattn.utils import cpu_name, write_markdown_section

B, HEADS, N, D = 1, 4, 256, 64
DECODE_ROWS = 8
EPSILONS = (1.0, 0.1, 0.01, 0.001, 0.0)
LAMBDAS = (0.2, 0.8, 1.0)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PATHS = ("math", "sdpa", "decode", "blockwise", "two-call")
DIFFATTN_PATHS = PATHS[:-1]


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2: the largest relative error of rounding a real number to ``dtype``."""
    return torch.finfo(dtype).eps / 2


def bound(dtype: torch.dtype, out_scale: float, first_scale: float, keys: int = N) -> float:
    """u · max |O| + √Nk · u32 · max |w1 ⊙ A1 V|: one rounding of the output to ``dtype``, plus float32's error in
    forming each term (sums over Nk keys, whose rounding errors grow like √Nk · u32: Higham & Mary 2019, "A New
    Approach to Probabilistic Rounding Error Analysis", Thm. 3.1). diffattn's paths stay within a small multiple of
    it; rounding both terms to ``dtype`` before subtracting adds u · (|w1 ⊙ A1 V| + |λ ⊙ A2 V|), which it does not
    cover when the terms cancel."""
    return unit_roundoff(dtype) * out_scale + math.sqrt(keys) * unit_roundoff(torch.float32) * first_scale


@dataclass
class Operands:
    """One case's operator inputs (B, heads, N, width) in float32, before rounding to the dtype under test."""

    q1: torch.Tensor
    k1: torch.Tensor
    q2: torch.Tensor
    k2: torch.Tensor  # k1 itself where the kind shares one K
    v: torch.Tensor
    weight1: float | torch.Tensor
    lambda_: float | torch.Tensor
    call: str  # "pairs", "pairs_shared_k" or "plain": the operator entry point the kind's layer uses


def _similar(x: torch.Tensor, eps: float, g: torch.Generator) -> torch.Tensor:
    return x + eps * torch.randn(x.shape, generator=g)


def _operands(kind: str, lam: float, eps: float, seed: int = 0) -> Operands:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g)

    if kind in ("diff", "gated"):
        q1, k1 = randn(B, HEADS, N, D), randn(B, HEADS, N, D)
        q2, k2, v = _similar(q1, eps, g), _similar(k1, eps, g), randn(B, HEADS, N, 2 * D)
        if kind == "diff":
            return Operands(q1, k1, q2, k2, v, 1.0, torch.tensor(lam), "pairs")
        gate = torch.full((B, HEADS, N, 1), 1.0 / (1.0 + lam))  # w1 = g, λ = 1 − g: λ / w1 = lam
        return Operands(q1, k1, q2, k2, v, gate, 1.0 - gate, "pairs")
    if kind == "diff_v2":
        q1, k = randn(B, HEADS, N, D), randn(B, HEADS // 2, N, D)
        return Operands(q1, k, _similar(q1, eps, g), k, randn(B, HEADS // 2, N, D), 1.0,
                        torch.full((B, HEADS, N, 1), lam), "pairs_shared_k")
    if kind == "grouped":  # 2 noise heads, each shared by r = 2 signal heads; one key/value head pair
        noise = randn(B, HEADS // 2, N, D).repeat_interleave(2, dim=1)  # each noise query once per signal head
        k1 = randn(B, 1, N, D)
        return Operands(_similar(noise, eps, g), k1, noise, _similar(k1, eps, g), randn(B, 1, N, 2 * D), 1.0,
                        torch.tensor(lam), "plain")
    if kind == "stable_audio":
        q1, k1 = randn(B, HEADS, N, D), randn(B, HEADS, N, D)
        return Operands(q1, k1, _similar(q1, eps, g), _similar(k1, eps, g), randn(B, HEADS, N, D), 1.0, 1.0, "plain")
    raise KeyError(kind)


#: the kinds measured, and the λ values their λ form can take (stable_audio fixes λ = 1)
KINDS: dict[str, tuple[float, ...]] = {"diff": LAMBDAS, "gated": LAMBDAS, "diff_v2": LAMBDAS, "grouped": LAMBDAS,
                                       "stable_audio": (1.0,)}


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(B, H, N, w) twice → (B, 2H, N, w) with a in the even heads and b in the odd ones."""
    return torch.stack((a, b), dim=2).flatten(1, 2)


def _cast(w: float | torch.Tensor, dtype: torch.dtype) -> float | torch.Tensor:
    return w.to(dtype) if isinstance(w, torch.Tensor) else w


def _rows(w: float | torch.Tensor, rows: slice) -> float | torch.Tensor:
    return w[:, :, rows] if isinstance(w, torch.Tensor) and w.dim() == 4 and w.shape[2] > 1 else w


def _operator(op: Operands, backend: str, q1, k1, q2, k2, v, w1, lam) -> torch.Tensor:
    """The kind's operator call (its entry point and head layout) on the given tensors."""
    if op.call == "pairs":
        return diff_attention_pairs(_interleave(q1, q2), _interleave(k1, k2), v, lam, weight1=w1, backend=backend)
    if op.call == "pairs_shared_k":
        return diff_attention_pairs(_interleave(q1, q2), k1, v, lam, k_paired=False, weight1=w1, backend=backend)
    return diff_attention(q1, k1, q2, k2, v, lam, weight1=w1, backend=backend)


def _two_call(q1, k1, q2, k2, v, w1, lam, dtype) -> torch.Tensor:
    """diffusers' recipe: one ``scaled_dot_product_attention`` per branch in the working dtype, w1 ⊙ O1 − λ ⊙ O2
    in the working dtype."""
    gqa = q1.shape[1] != k1.shape[1]
    o1 = F.scaled_dot_product_attention(q1, k1, v, enable_gqa=gqa)
    o2 = F.scaled_dot_product_attention(q2, k2, v, enable_gqa=gqa)
    return _cast(w1, dtype) * o1 - _cast(lam, dtype) * o2


def measure_case(kind: str, dtype: torch.dtype, lam: float, eps: float) -> list[dict]:
    """Every path's error for one kind, dtype, λ and ε (the paths that apply to the dtype)."""
    op = _operands(kind, lam, eps)
    x = [t.to(dtype) for t in (op.q1, op.k1, op.q2, op.k2, op.v)]
    if op.k2 is op.k1:
        x[3] = x[1]  # one K for both branches stays one tensor
    x64 = [t.double() for t in x]
    if op.k2 is op.k1:
        x64[3] = x64[1]
    w1_64, lam_64 = _cast(op.weight1, torch.float64), _cast(op.lambda_, torch.float64)

    def reference(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        q1, k1, q2, k2, v = x64
        q1, q2 = q1[:, :, rows], q2[:, :, rows]
        w1, lam_r = _rows(w1_64, rows), _rows(lam_64, rows)
        ref = _operator(op, "math", q1, k1, q2, k2, v, w1, lam_r)
        first = _operator(op, "math", q1, k1, q2, k2, v, w1, 0.0)  # w1 ⊙ A1 V, the cancelled term
        return ref, first

    def run(path: str) -> tuple[torch.Tensor, slice]:
        q1, k1, q2, k2, v = x
        every = slice(None)
        if path in ("math", "sdpa"):
            return _operator(op, path, q1, k1, q2, k2, v, op.weight1, op.lambda_), every
        if path == "decode":
            rows = slice(N - DECODE_ROWS, N)
            return decode_diff_attention(q1[:, :, rows], k1, q2[:, :, rows], k2, v, _rows(op.lambda_, rows),
                                         weight1=_rows(op.weight1, rows), scale=1 / math.sqrt(D)), rows
        if path == "blockwise":
            return blockwise_diff_attention(q1, k1, q2, k2, v, op.lambda_, op.weight1, None, None, False,
                                            1 / math.sqrt(D)), every
        return _two_call(q1, k1, q2, k2, v, op.weight1, op.lambda_, dtype), every

    refs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # by (first row, end row)
    rows_out = []
    with torch.no_grad():
        for path in PATHS:
            if path == "blockwise" and dtype not in (torch.float32, torch.float64):
                continue  # the operator takes it for float32 and float64 only
            out, rows = run(path)
            key = (rows.start, rows.stop)
            if key not in refs:
                refs[key] = reference(rows)
            ref, first = refs[key]
            err = (out.double() - ref).abs().max().item()
            scale, first_scale = ref.abs().max().item(), first.abs().max().item()
            rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
            rows_out.append(dict(kind=kind, path=path, dtype=str(dtype).removeprefix("torch."), lam=lam, eps=eps,
                                 err=err, rel_out=rel, rel_a1v=err / first_scale, out_scale=scale,
                                 a1v_scale=first_scale, bound_factor=err / bound(dtype, scale, first_scale)))
    return rows_out


def measure(kinds: list[str], dtypes: tuple[torch.dtype, ...] = DTYPES,
            progress: Callable[[str], None] | None = None) -> list[dict]:
    rows = []
    for kind in kinds:
        for dtype in dtypes:
            for lam in KINDS[kind]:
                for eps in EPSILONS:
                    rows += measure_case(kind, dtype, lam, eps)
        if progress is not None:
            progress(kind)
    return rows


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf"
    return f"{x:.1e}"


def render(record: dict) -> str:
    """The markdown section: the worst cases over kinds and λ per path, dtype and ε; the cancelling case per kind."""
    rows = record["rows"]
    dtypes = [d for d in ("float32", "bfloat16", "float16") if any(r["dtype"] == d for r in rows)]

    def worst(metric: str, path: str, dtype: str, eps: float) -> str:
        vals = [r[metric] for r in rows if r["path"] == path and r["dtype"] == dtype and r["eps"] == eps]
        return _fmt(max(vals)) if vals else "—"

    head = "| path | dtype | " + " | ".join(f"ε = {e:g}" for e in EPSILONS) + " |"
    rule = "|---|---|" + "---:|" * len(EPSILONS)

    def table(metric: str) -> list[str]:
        out = [head, rule]
        for path in PATHS:
            for dtype in dtypes:
                if path == "blockwise" and dtype != "float32":
                    continue
                name = "two-call recipe" if path == "two-call" else f"diffattn `{path}`"
                out.append(f"| {name} | {dtype} | " + " | ".join(worst(metric, path, dtype, e) for e in EPSILONS)
                           + " |")
        return out

    diffattn_worst = max((r["bound_factor"] for r in rows if r["path"] in DIFFATTN_PATHS), default=0.0)
    two_call = [r["bound_factor"] for r in rows if r["path"] == "two-call" and r["eps"] == 0.001 and
                r["lam"] == 1.0 and r["dtype"] in ("bfloat16", "float16")]
    lines = [
        f"Measured on {record['device']}, torch {record['torch']}, {record['threads']} thread(s), in "
        f"{record['seconds']:.0f} s: B = {B}, 4 differential heads, N = {N}, d = {D}; q2 = q1 + ε·noise, "
        f"k2 = k1 + ε·noise; inputs rounded to the dtype, reference = the float64 operator on the rounded inputs. "
        "Each cell is the worst over the kinds (diff, gated, diff_v2, grouped, stable_audio) and λ ∈ {0.2, 0.8, 1}.",
        "", "Command:", "", "```", "python benchmarks/precision.py --markdown docs/reliability.md", "```", "",
        "Error relative to the output's scale, max |O − O_ref| / max |O_ref| (at ε = 0 and λ = w1 the output is "
        "exactly 0, and so is every path's):", "", *table("rel_out"), "",
        "Error relative to the cancelled term, max |O − O_ref| / max |w1 ⊙ A1 V|:", "", *table("rel_a1v"), "",
        f"Bound factor err / (u · max |O_ref| + √Nk · u32 · max |w1 ⊙ A1 V|), u the dtype's unit roundoff: at most "
        f"{diffattn_worst:.2f} for every "
        f"diffattn path, dtype and case above; the two-call recipe in bfloat16/float16 at ε = 0.001, λ = 1: "
        f"{_fmt(min(two_call)) if two_call else '—'} to {_fmt(max(two_call)) if two_call else '—'}.", "",
        "The cancelling case per kind (ε = 0.001), error relative to the output's scale; "
        "‖w1 A1 V‖ / ‖O‖ is how much the subtraction cancels:", "",
        "| kind | dtype | λ | ‖w1 A1 V‖ / ‖O‖ | math | sdpa | decode | two-call recipe |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in record["kinds"]:
        for dtype in ("bfloat16", "float16"):
            for lam in (1.0, 0.8):
                cell = {r["path"]: r for r in rows if r["kind"] == kind and r["dtype"] == dtype and r["lam"] == lam
                        and r["eps"] == 0.001}
                if not cell:
                    continue
                ratio = cell["math"]["a1v_scale"] / cell["math"]["out_scale"]
                lines.append(f"| {kind} | {dtype} | {lam:g} | {ratio:.0f} | " + " | ".join(
                    _fmt(cell[p]["rel_out"]) if p in cell else "—" for p in ("math", "sdpa", "decode", "two-call"))
                             + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=None, help=f"default: every measured kind ({', '.join(KINDS)})")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a shared machine)")
    ap.add_argument("--json", type=Path, default=None, help="also write every case's numbers to this file")
    ap.add_argument("--markdown", default=None, help="write the tables into this file's 'precision' section")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    differential = [k for k in ATTENTION_TYPES if k != "standard"]
    unknown = sorted(set(args.kinds or []) - set(KINDS))
    if unknown:
        raise SystemExit(f"--kinds: {unknown} are not measured here; choose from {list(KINDS)}")
    kinds = args.kinds or [k for k in differential if k in KINDS]
    missing = [k for k in differential if k not in KINDS]
    if missing and not args.kinds:
        print(f"not measured (no operator recipe here): {missing}", flush=True)
    t0 = time.perf_counter()
    rows = measure(kinds, progress=lambda k: print(f"{k}: {time.perf_counter() - t0:.0f} s", flush=True))
    record = dict(device=f"{cpu_name()}, {os.cpu_count()} cores", torch=torch.__version__, threads=args.threads,
                  seconds=time.perf_counter() - t0, kinds=kinds, rows=rows,
                  command="python benchmarks/precision.py" + (f" --markdown {args.markdown}" if args.markdown else ""))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    table = render(record)
    print(table)
    if args.markdown:
        write_markdown_section(args.markdown, "precision", table)


if __name__ == "__main__":
    main()
