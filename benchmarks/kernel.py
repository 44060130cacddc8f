"""Benchmark of the differential-attention core on one GPU: forward and forward+backward time, TFLOP/s and memory.

Compares, at a fixed number of tokens B·N and model width D = h·d (h standard heads of width d; the differential
methods use H = h/2 heads with Q/K of width d and V of width 2d, the parameter-matched layout of Ye et al. 2024):

    sdpa_flash    standard attention, F.scaled_dot_product_attention on (B, h, N, d), FlashAttention backend
    diff_triton   diffattn.functional.diff_attention(backend="triton"): the fused one-pass kernel
    diff_sdpa     diff_attention(backend="sdpa"): two SDPA calls with Q/K zero-padded to 2d (FlashAttention)
    diff_sdpa2    two SDPA calls with Q/K of width d and V of width 2d, on the first SDPA backend that takes unequal
                  widths (FlashAttention does not; cuDNN or memory-efficient attention)
    diff_flash4   four FlashAttention calls (2 branches × the two width-d halves of V)

FLOPs (matmuls only, per standard head, halved when causal): standard attention 4·N²·d forward and 10·N²·d
backward (FlashAttention-2 recomputes Q Kᵀ); the fused differential kernel 6·N²·d forward (Q Kᵀ the same, P V
doubled because V is 2d wide) and 10·N²·d backward (dV and dP = dO Vᵀ are each one matmul for both branches), so
1.5× the forward and 1.14× the forward+backward of standard attention. Two calls with V of width 2d do 1.5× and
1.43×, four calls 2.0× and 2.0×, two calls with Q/K padded to 2d 2.0× and 2.0×. TFLOP/s below counts the fused
kernel's FLOPs for every differential method (the work the operator needs), so it compares like with like.

``--tune`` first times a few tile configurations of each kernel (forward, dK/dV, dQ) at one length per head width
and uses the fastest for the rest of the run (the choice is in the JSON). ``--precompile-workers`` compiles the
Triton kernels in that many processes before anything is timed (Triton's on-disk cache then serves the timed
process).

    python benchmarks/kernel.py --tune --out kernel.json        # on a GPU: measure
    python benchmarks/kernel.py --render kernel.json --markdown docs/benchmarks.md   # anywhere: the docs table
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import astuple
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import diffattn  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from diffattn.ops import diff_attention  # noqa: E402

METHODS = ("sdpa_flash", "diff_triton", "diff_sdpa", "diff_sdpa2", "diff_flash4")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LAMBDA = 0.8

#: matmul FLOPs per standard head per N²·d: (forward, forward + backward); the differential methods are credited
#: the fused kernel's (module docstring)
FLOPS_PER_HEAD = {"standard": (4.0, 14.0), "diff": (6.0, 16.0)}

#: tile candidates (BLOCK_M, BLOCK_N, num_warps, num_stages) per (d, dv) and kernel; the first of each list is the
#: library's table (src/diffattn/ops/kernels/triton_diff.py, _tiles), the others its neighbours
CANDIDATES = {
    (64, 128): {
        "fwd": [(128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 8, 4), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 3)],
        "dkdv": [(32, 64, 4, 2), (32, 128, 4, 2), (16, 64, 4, 2), (32, 64, 4, 3), (64, 64, 4, 2), (32, 32, 4, 2)],
        "dq": [(64, 64, 4, 2), (64, 32, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2)],
    },
    (128, 256): {
        "fwd": [(64, 64, 8, 2), (64, 64, 8, 3), (64, 32, 8, 2), (128, 64, 8, 2), (64, 128, 8, 2), (32, 64, 4, 2)],
        "dkdv": [(32, 32, 4, 2), (32, 64, 4, 2), (16, 32, 4, 2), (16, 64, 4, 2), (32, 32, 4, 3), (64, 32, 4, 2)],
        "dq": [(128, 32, 8, 2), (128, 64, 8, 2), (64, 64, 8, 2), (128, 32, 8, 3), (64, 32, 4, 2), (128, 32, 4, 2)],
    },
    (32, 64): {
        "fwd": [(128, 64, 8, 2), (128, 64, 4, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2)],
        "dkdv": [(32, 64, 8, 2), (32, 64, 4, 2), (32, 128, 4, 2), (64, 64, 4, 2), (64, 128, 8, 2)],
        "dq": [(128, 32, 8, 2), (64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 2), (128, 64, 4, 2)],
    },
    (64, 64): {
        "fwd": [(128, 64, 8, 2), (128, 64, 4, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2)],
        "dkdv": [(32, 64, 8, 2), (32, 64, 4, 2), (32, 128, 4, 2), (64, 64, 4, 2), (64, 128, 8, 2)],
        "dq": [(128, 32, 8, 2), (64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 2), (128, 64, 4, 2)],
    },
}


def _sdp(name: str):
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, name)


def flops(kind: str, batch: int, heads: int, seqlen: int, width: int, causal: bool) -> tuple[float, float]:
    """(forward, forward + backward) matmul FLOPs; ``heads`` counts standard heads of width ``width``."""
    f, fb = FLOPS_PER_HEAD[kind]
    base = batch * heads * seqlen * seqlen * width / (2 if causal else 1)
    return f * base, fb * base


def time_ms(fn: Callable[[], object], warmup: int, rep: int) -> float:
    """Median time of ``fn`` in ms by triton.testing.do_bench (CUDA events, L2 flushed between runs)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def make_problem(method: str, batch: int, seqlen: int, dim: int, width: int, dtype: torch.dtype, causal: bool,
                 seed: int = 0, dev: str = "cuda") -> tuple[Callable[[], torch.Tensor], list[torch.Tensor], str]:
    """A closure computing one layer's attention core, the leaves that get gradients, and the SDPA backend used."""
    from torch.nn.attention import sdpa_kernel

    torch.manual_seed(seed)

    def rnd(heads: int, w: int) -> torch.Tensor:
        return torch.randn(batch, heads, seqlen, w, device=dev, dtype=dtype, requires_grad=True)

    h = dim // width  # standard heads
    if method == "sdpa_flash":
        q, k, v = rnd(h, width), rnd(h, width), rnd(h, width)

        def standard() -> torch.Tensor:
            with sdpa_kernel(_sdp("FLASH_ATTENTION")):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return standard, [q, k, v], "flash"

    H = h // 2  # differential heads: Q/K as 2H heads of width d, V as H heads of width 2d
    q1, k1, q2, k2, v = rnd(H, width), rnd(H, width), rnd(H, width), rnd(H, width), rnd(H, 2 * width)
    leaves = [q1, k1, q2, k2, v]
    if method in ("diff_sdpa", "diff_triton"):
        backend = method.removeprefix("diff_")
        return (lambda: diff_attention(q1, k1, q2, k2, v, LAMBDA, is_causal=causal, backend=backend)), leaves, \
            "flash" if backend == "sdpa" else "triton"
    if method == "diff_flash4":
        def four() -> torch.Tensor:
            with sdpa_kernel(_sdp("FLASH_ATTENTION")):
                halves = v.chunk(2, dim=-1)  # two (B, H, N, d) views
                sdpa = F.scaled_dot_product_attention
                o1 = torch.cat([sdpa(q1, k1, x, is_causal=causal) for x in halves], -1)
                o2 = torch.cat([sdpa(q2, k2, x, is_causal=causal) for x in halves], -1)
            return o1 - LAMBDA * o2

        return four, leaves, "flash"
    if method == "diff_sdpa2":
        errors = []
        for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
            def two(name=name) -> torch.Tensor:
                with sdpa_kernel(_sdp(name)):
                    o1 = F.scaled_dot_product_attention(q1, k1, v, is_causal=causal)
                    o2 = F.scaled_dot_product_attention(q2, k2, v, is_causal=causal)
                return o1 - LAMBDA * o2

            try:  # the first backend that runs forward and backward with V twice as wide as Q/K
                out = two()
                torch.autograd.grad(out, leaves, torch.ones_like(out))
                torch.cuda.synchronize()
                return two, leaves, name.removesuffix("_ATTENTION").lower()
            except RuntimeError as e:
                errors.append(f"{name}: {str(e).splitlines()[0][:80]}")
        raise RuntimeError("no SDPA backend takes V wider than Q/K: " + "; ".join(errors))
    raise ValueError(f"unknown method {method!r}")


def bench_one(method: str, batch: int, seqlen: int, dim: int, width: int, dtype: torch.dtype, causal: bool,
              warmup: int, rep: int) -> dict:
    row = dict(method=method, batch=batch, seqlen=seqlen, head_dim=width, causal=causal)
    fwd_flops, fb_flops = flops("standard" if method == "sdpa_flash" else "diff", batch, dim // width, seqlen,
                                width, causal)
    try:
        fn, leaves, backend = make_problem(method, batch, seqlen, dim, width, dtype, causal)
        row["backend"] = backend
        with torch.no_grad():
            row["fwd_ms"] = time_ms(fn, warmup, rep)
        grad = torch.randn_like(fn())

        def fwd_bwd() -> None:
            torch.autograd.grad(fn(), leaves, grad)

        fwd_bwd()  # compiled and warm before the memory reading
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        torch.cuda.synchronize()
        row["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20  # above the inputs and dO
        row["fwd_bwd_ms"] = time_ms(fwd_bwd, warmup, rep)
        row["fwd_tflops"] = fwd_flops / row["fwd_ms"] / 1e9
        row["fwd_bwd_tflops"] = fb_flops / row["fwd_bwd_ms"] / 1e9
    except Exception as e:  # noqa: BLE001 - one failed row (out of memory, out of shared memory) is reported
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        torch.cuda.empty_cache()
    return row


# ------------------------------------------------------------------------------------------------ tile tuning


def _kernel_inputs(batch, seqlen, width, heads, dtype, causal, dev="cuda", dv=None):
    """Inputs of the kernels at the benchmark's layout, with the saved forward state for the backward."""
    from diffattn.ops.kernels import triton_diff as td

    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(w):
        return torch.randn(batch, heads, seqlen, w, device=dev, dtype=dtype, generator=g)

    q1, k1, q2, k2, v = rnd(width), rnd(width), rnd(width), rnd(width), rnd(dv or 2 * width)
    lam, w1 = torch.full((), LAMBDA, device=dev), torch.full((), 1.0, device=dev)
    scale = width**-0.5
    _, o1, o2, lse = td._fwd_impl(q1, k1, q2, k2, v, lam, w1, None, causal, scale, True)
    do = torch.randn_like(o1)
    return dict(q1=q1, k1=k1, q2=q2, k2=k2, v=v, lam=lam, w1=w1, scale=scale, o1=o1, o2=o2, lse=lse, do=do)


def _run_kernel(kind: str, x: dict, causal: bool, fwd, kv, q):
    """One call of the forward (kind "fwd") or of the whole backward (kinds "dkdv", "dq") with these tiles."""
    from diffattn.ops.kernels import triton_diff as td

    if kind == "fwd":
        return td._fwd_impl(x["q1"], x["k1"], x["q2"], x["k2"], x["v"], x["lam"], x["w1"], None, causal,
                            x["scale"], True, tiles=fwd)
    return td._bwd_impl(x["do"], x["q1"], x["k1"], x["q2"], x["k2"], x["v"], x["o1"], x["o2"], x["lse"],
                        x["lam"], x["w1"], None, causal, x["scale"], tiles=(kv, q))


def _precompile_task(task: dict) -> dict:
    """In a worker process: run one kernel configuration once at a small size, so that Triton compiles it and
    keeps it in its on-disk cache. The small size keeps the specialisations of the timed size (lengths and
    strides divisible by 16, the same head count)."""
    from diffattn.ops.kernels import triton_diff as td

    t0 = time.perf_counter()
    try:
        dtype = DTYPES[task["dtype"]]
        if task["kind"] == "method":  # the fused method's kernels for inference or training
            with td.override_tiles(task["d"], 2 * task["d"], *(td._Tiles(*t) for t in task["tiles"])):
                fn, leaves, _ = make_problem("diff_triton", 1, 256, task["dim"], task["d"], dtype, task["causal"])
                if task["train"]:
                    out = fn()
                    torch.autograd.grad(out, leaves, torch.ones_like(out))
                else:
                    with torch.no_grad():
                        fn()
        else:  # a candidate must compile with and without the causal mask (the causal one can need more memory)
            tiles = td._tiles(task["d"], task["dv"], dtype)
            t = td._Tiles(*task["tiles"])
            fwd, kv, q = (t if task["kind"] == k else tiles[i] for i, k in enumerate(("fwd", "dkdv", "dq")))
            for causal in (False, True):
                x = _kernel_inputs(1, 256, task["d"], task["heads"], dtype, causal, dv=task["dv"])
                _run_kernel(task["kind"], x, causal, fwd, kv, q)
        torch.cuda.synchronize()
        return dict(task, seconds=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - reported per configuration (e.g. out of shared memory)
        return dict(task, seconds=time.perf_counter() - t0, error=f"{type(e).__name__}: {str(e)[:200]}")


def precompile(tasks: list[dict], workers: int) -> list[dict]:
    """Run :func:`_precompile_task` for every task in ``workers`` spawned processes; returns their reports."""
    if workers <= 0 or not tasks:
        return []
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(_precompile_task, tasks))


def tune(shapes: list[tuple[int, int]], dim: int, seqlen: int, tokens: int, dtype_name: str, warmup: int,
         rep: int, workers: int) -> dict:
    """Time each candidate tile configuration of each kernel (non-causal, ``seqlen``, D/2d heads), one kernel at a
    time with the others at their current choice; returns {"dxdv": {"fwd"|"dkdv"|"dq": {"best", "ms"}}}."""
    from diffattn.ops.kernels import triton_diff as td

    dtype = DTYPES[dtype_name]
    tasks = [dict(kind=kind, d=d, dv=dv, heads=dim // d // 2, dtype=dtype_name, tiles=t)
             for d, dv in shapes for kind, cands in CANDIDATES[(d, dv)].items() for t in cands]
    t0 = time.perf_counter()
    reports = precompile(tasks, workers)
    print(f"# precompiled {len(tasks)} tile configurations in {time.perf_counter() - t0:.1f} s "
          f"({workers} processes)", file=sys.stderr, flush=True)
    failed = {(r["kind"], r["d"], r["dv"], tuple(r["tiles"])): r["error"] for r in reports if "error" in r}
    result = {}
    for d, dv in shapes:
        x = _kernel_inputs(max(1, tokens // seqlen), seqlen, d, dim // d // 2, dtype, False, dv=dv)
        choice = dict(zip(("fwd", "dkdv", "dq"), td._tiles(d, dv, dtype)))
        key = f"{d}x{dv}"
        result[key] = {}
        for kind in ("fwd", "dkdv", "dq"):
            times = {}
            for t in CANDIDATES[(d, dv)][kind]:
                if (kind, d, dv, t) in failed:
                    times[str(t)] = failed[(kind, d, dv, t)]
                    continue
                trial = dict(choice, **{kind: td._Tiles(*t)})
                try:
                    times[str(t)] = time_ms(lambda k=kind, x=x, tr=trial: _run_kernel(k, x, False, tr["fwd"],
                                                                                      tr["dkdv"], tr["dq"]),
                                            warmup, rep)
                except Exception as e:  # noqa: BLE001 - a configuration that does not run is reported, not fatal
                    times[str(t)] = f"{type(e).__name__}: {str(e)[:200]}"
            ok = {k: v for k, v in times.items() if isinstance(v, float)}
            if ok:
                best = min(ok, key=ok.get)
                choice[kind] = next(td._Tiles(*t) for t in CANDIDATES[(d, dv)][kind] if str(t) == best)
            result[key][kind] = dict(best=list(astuple(choice[kind])), ms=times)
            print(f"# tune d={d} dv={dv} {kind}: " + ", ".join(
                f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in times.items()),
                file=sys.stderr, flush=True)
        del x
        torch.cuda.empty_cache()
    return result


# --------------------------------------------------------------------------------------------------- tables


def _ratio_rows(rows: list[dict]) -> dict:
    """(head_dim, causal, seqlen, method) → row."""
    return {(r["head_dim"], r["causal"], r["seqlen"], r["method"]): r for r in rows}


def goals(rows: list[dict]) -> list[str]:
    """The two goals, stated met or not, from the rows: fused fwd+bwd ≤ 1.3× standard SDPA (FlashAttention) at
    every measured shape, and ≥ 1.3× faster than the ``sdpa`` backend for N ≥ 2048."""
    by = _ratio_rows(rows)
    vs_std, vs_sdpa = [], []
    for (d, c, n, m), r in by.items():
        if m != "diff_triton" or "error" in r:
            continue
        std, sd = by.get((d, c, n, "sdpa_flash")), by.get((d, c, n, "diff_sdpa"))
        if std and "error" not in std:
            vs_std.append((r["fwd_bwd_ms"] / std["fwd_bwd_ms"], d, c, n))
        if sd and "error" not in sd and n >= 2048:
            vs_sdpa.append((sd["fwd_bwd_ms"] / r["fwd_bwd_ms"], d, c, n))
    out = []

    def per_width(items, ok) -> str:
        widths = sorted({x[1] for x in items})
        return "; ".join(f"d = {d}: {sum(ok(x) for x in items if x[1] == d)} of {sum(x[1] == d for x in items)}"
                         for d in widths)

    if vs_std:
        worst = max(vs_std)
        n_ok = sum(x[0] <= 1.3 for x in vs_std)
        out.append(f"- fwd+bwd ≤ 1.3× standard SDPA (FlashAttention): **{'met' if n_ok == len(vs_std) else 'not met'}**"
                   f" ({n_ok} of {len(vs_std)} shapes, {per_width(vs_std, lambda x: x[0] <= 1.3)}; "
                   f"{min(vs_std)[0]:.2f}× to {worst[0]:.2f}×, the worst at d = {worst[1]}, "
                   f"{'causal' if worst[2] else 'full'}, N = {worst[3]})")
    if vs_sdpa:
        worst = min(vs_sdpa)
        n_ok = sum(x[0] >= 1.3 for x in vs_sdpa)
        out.append(f"- ≥ 1.3× faster than the `sdpa` backend for N ≥ 2048: "
                   f"**{'met' if n_ok == len(vs_sdpa) else 'not met'}** ({n_ok} of {len(vs_sdpa)} shapes, "
                   f"{per_width(vs_sdpa, lambda x: x[0] >= 1.3)}; {worst[0]:.2f}× to {max(vs_sdpa)[0]:.2f}× "
                   f"faster, the least at d = {worst[1]}, {'causal' if worst[2] else 'full'}, N = {worst[3]})")
    return out


def markdown(result: dict, command: str, title: str = "Fused Triton kernel") -> str:
    rows = result["rows"]
    by = _ratio_rows(rows)
    lines = [f"### {title}, {result['device']}", "",
             f"Device: {result['device']} (torch {result['torch']}, triton {result['triton']}, CUDA "
             f"{result.get('cuda', '?')}). {result['dtype']}, B·N = {result['tokens']} tokens, model width D = "
             f"{result['dim']} (standard: D/d heads of width d; differential: D/2d heads, Q/K width d, V width 2d). "
             f"Median of `triton.testing.do_bench`; memory is the peak allocated during one forward+backward above "
             f"the inputs. TFLOP/s counts each method's needed FLOPs (standard 4·N²·d forward, 14·N²·d fwd+bwd "
             f"per head; differential 6 and 16), halved when causal.", "", "Command:", "", "```", command, "```", ""]
    if result.get("tuning"):
        lines += ["Tiles chosen by the run's sweep (BLOCK_M, BLOCK_N, warps, stages; non-causal, N = "
                  f"{result.get('tune_seqlen')}):", ""]
        for shape, kinds in result["tuning"].items():
            d, dv = shape.split("x")
            lines.append(f"- d = {d}, dv = {dv}: " + "; ".join(f"{k} {tuple(v['best'])}" for k, v in kinds.items()))
        lines.append("")
    else:
        lines += ["Tiles: the library's table (`_tiles` in src/diffattn/ops/kernels/triton_diff.py).", ""]
    lines += ["Goals:", ""] + goals(rows) + [""]
    lines += ["| d | causal | N | B | method | SDPA backend | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | "
              "fwd+bwd × standard | `sdpa` backend time ÷ this | peak MiB |",
              "|---:|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        head = (f"| {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | {r['batch']} | "
                f"{r['method']} | {r.get('backend', '')} ")
        if "error" in r:
            lines.append(head + f"| {r['error'][:80]} | | | | | | |")
            continue
        std = by.get((r["head_dim"], r["causal"], r["seqlen"], "sdpa_flash"))
        ratio = f"{r['fwd_bwd_ms'] / std['fwd_bwd_ms']:.2f}" if std and "error" not in std else ""
        ours = by.get((r["head_dim"], r["causal"], r["seqlen"], "diff_sdpa"))
        vs_ours = (f"{ours['fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}"
                   if ours and "error" not in ours and r["method"].startswith("diff") else "")
        lines.append(head + f"| {r['fwd_ms']:.3f} | {r['fwd_tflops']:.0f} | {r['fwd_bwd_ms']:.3f} | "
                     f"{r['fwd_bwd_tflops']:.0f} | {ratio} | {vs_ours} | {r['peak_mib']:.0f} |")
    return "\n".join(lines)


def tuning_markdown(results: list[tuple[str, dict]]) -> str:
    """The tile sweeps of ``--tune`` runs: per shape and kernel, each candidate's time and the choice."""
    lines = ["### Tile sweeps", "",
             "Each kernel's candidates (BLOCK_M, BLOCK_N, warps, stages) timed with the other two kernels at their "
             "current choice, bf16, non-causal; forward: the forward alone; dK/dV and dQ: the whole backward "
             "(preprocess, dK/dV, dQ), so the differences come from the kernel varied. ms, median of "
             "`triton.testing.do_bench`; **bold**: fastest; a candidate that did not compile (with or without the "
             "causal mask) says why.", ""]
    for path, result in results:
        lines += [f"`{path}` — device: {result['device']} (torch {result['torch']}, triton {result['triton']}); N = "
                  f"{result['tune_seqlen']}, B·N = {result['tokens']}, D = {result['dim']}. Command:", "", "```",
                  result["command"], "```", ""]
        for shape, kinds in result["tuning"].items():
            d, dv = shape.split("x") if "x" in shape else (shape, str(2 * int(shape)))
            for kind, v in kinds.items():
                best = str(tuple(v["best"]))
                cells = [(f"**{k}: {t:.3f}**" if k == best else f"{k}: {t:.3f}") if isinstance(t, float)
                         else f"{k}: {t.split(':')[0]}" for k, t in v["ms"].items()]
                lines.append(f"- d = {d}, dv = {dv}, {kind}: " + ", ".join(cells))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384, help="B·N, fixed across sequence lengths")
    p.add_argument("--dim", type=int, default=2048, help="model width D = h·d")
    p.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--causal", type=int, nargs="+", choices=[0, 1], default=[0, 1])
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--warmup", type=int, default=10, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=int, default=60, help="do_bench repetition time, ms")
    p.add_argument("--tune", action="store_true", help="time tile candidates first and use the fastest")
    p.add_argument("--tune-seqlen", type=int, default=4096)
    p.add_argument("--tune-extra", nargs="*", default=["32x64", "64x64"],
                   help="more (d)x(dv) shapes to tune (their tiles go to the JSON, not to the table)")
    p.add_argument("--precompile-workers", type=int, default=min(12, os.cpu_count() or 1))
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--render", type=Path, help="do not measure: render this JSON result")
    p.add_argument("--markdown", type=Path, help="write the table into this markdown file's section")
    p.add_argument("--section", default="kernel-gpu", help="the section's marker name in --markdown")
    p.add_argument("--title", default="Fused Triton kernel", help="the rendered table's title")
    p.add_argument("--render-tuning", type=Path, nargs="+", help="do not measure: render these runs' tile sweeps")
    p.add_argument("--command", default=None, help="the command to print beside the table (default: this one)")
    args = p.parse_args(argv)

    if args.render:
        result = json.loads(args.render.read_text())
        text = markdown(result, result.get("command", ""), args.title)
        if args.markdown:
            from diffattn.utils import write_markdown_section

            write_markdown_section(args.markdown, args.section, text)
        print(text)
        return
    if args.render_tuning:
        text = tuning_markdown([(str(path), json.loads(path.read_text())) for path in args.render_tuning])
        if args.markdown:
            from diffattn.utils import write_markdown_section

            write_markdown_section(args.markdown, args.section, text)
        print(text)
        return

    if not torch.cuda.is_available():
        sys.exit("benchmarks/kernel.py times CUDA kernels and needs a CUDA GPU; none is available here.")
    import triton

    from diffattn.ops.kernels import triton_diff as td

    command = args.command or "python benchmarks/kernel.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  cuda=torch.version.cuda, dtype=args.dtype, tokens=args.tokens, dim=args.dim, command=command,
                  rows=[])
    t_start = time.perf_counter()
    if args.tune:
        shapes = [(d, 2 * d) for d in args.head_dims]
        extra = [tuple(map(int, x.split("x"))) for x in args.tune_extra]
        shapes += [x for x in extra if x not in shapes]
        result["tuning"] = tune(shapes, args.dim, args.tune_seqlen, args.tokens, args.dtype, args.warmup, args.rep,
                                args.precompile_workers)
        result["tune_seqlen"] = args.tune_seqlen
        result["tune_seconds"] = time.perf_counter() - t_start
    if args.tune:
        chosen = {d: tuple(td._Tiles(*result["tuning"][f"{d}x{2 * d}"][k]["best"]) for k in ("fwd", "dkdv", "dq"))
                  for d in args.head_dims}
    else:
        chosen = {d: td._tiles(d, 2 * d, DTYPES[args.dtype]) for d in args.head_dims}
    if "diff_triton" in args.methods:
        t0 = time.perf_counter()
        tasks = [dict(kind="method", d=d, dim=args.dim, dtype=args.dtype, causal=bool(c), train=train,
                      tiles=[list(astuple(t)) for t in chosen[d]])
                 for d in args.head_dims for c in args.causal for train in (False, True)]
        reports = precompile(tasks, args.precompile_workers)
        print(f"# precompiled the fused method in {time.perf_counter() - t0:.1f} s: "
              + "; ".join(r.get("error", "ok") for r in reports), file=sys.stderr, flush=True)

    def save() -> None:
        result["seconds"] = time.perf_counter() - t_start
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))

    for width in args.head_dims:
        with td.override_tiles(width, 2 * width, *chosen[width]):
            for causal in map(bool, args.causal):
                for seqlen in args.seqlens:
                    batch = max(1, args.tokens // seqlen)
                    for method in args.methods:
                        row = bench_one(method, batch, seqlen, args.dim, width, DTYPES[args.dtype], causal,
                                        args.warmup, args.rep)
                        result["rows"].append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
                    save()
    save()
    text = markdown(result, command, args.title)
    if args.markdown:
        from diffattn.utils import write_markdown_section

        write_markdown_section(args.markdown, args.section, text)
    print(text)


if __name__ == "__main__":
    main()
