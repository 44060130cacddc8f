"""Benchmark of the differential-attention core on one GPU: forward and forward+backward time and TFLOP/s.

Compares, at a fixed number of tokens B·N and fixed model width D = h·d (h standard heads of width d):

    sdpa_standard   standard attention, F.scaled_dot_product_attention on (B, h, N, d) (fastest backend)
    diff_sdpa       diffattn.functional.diff_attention(backend="sdpa"): H = h/2 differential heads, V width 2d
    diff_flash4     four calls of the flash SDPA backend (2 branches × 2 halves of V, each of width d)
    diff_triton     diffattn.functional.diff_attention(backend="triton"): the fused one-pass kernel

Throughput counts useful FLOPs: standard attention does 4·B·h·N²·d in the forward (two matmuls), halved when
causal, and 2.5× that in the backward; differential attention at equal parameters does 1.5× the standard
attention FLOPs (QKᵀ the same, PV doubled because V is 2d wide; docs/design.md, "Cost"). diff_flash4 really does 2×
(it splits V), but is credited 1.5×, the work the operator needs.

    python benchmarks/kernel.py --markdown --out kernel.json
    python benchmarks/kernel.py --seqlens 1024 4096 --head-dims 128 --causal 1 --markdown
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    from diffattn.functional import diff_attention
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from diffattn.functional import diff_attention

METHODS = ("sdpa_standard", "diff_sdpa", "diff_flash4", "diff_triton")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def attention_flops(batch: int, heads: int, seqlen: int, width: int, causal: bool) -> float:
    """Forward FLOPs of standard attention, 4·B·h·N²·d (QKᵀ and PV), halved when causal."""
    f = 4.0 * batch * heads * seqlen * seqlen * width
    return f / 2 if causal else f


def time_ms(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds, measured with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def make_problem(method: str, batch: int, seqlen: int, dim: int, width: int, dtype: torch.dtype,
                 causal: bool) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
    """A closure computing the attention core of one layer, and the leaf tensors that get gradients."""
    dev = "cuda"

    def rnd(heads: int, w: int) -> torch.Tensor:
        return torch.randn(batch, heads, seqlen, w, device=dev, dtype=dtype, requires_grad=True)

    h = dim // width  # standard heads
    if method == "sdpa_standard":
        q, k, v = rnd(h, width), rnd(h, width), rnd(h, width)
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)), [q, k, v]

    H = h // 2  # differential heads: Q/K as 2H heads of width d, V as H heads of width 2d
    q1, k1, q2, k2, v = rnd(H, width), rnd(H, width), rnd(H, width), rnd(H, width), rnd(H, 2 * width)
    lam = 0.8
    leaves = [q1, k1, q2, k2, v]
    if method in ("diff_sdpa", "diff_triton"):
        backend = method.removeprefix("diff_")
        return (lambda: diff_attention(q1, k1, q2, k2, v, lam, is_causal=causal, backend=backend)), leaves
    if method == "diff_flash4":
        def run() -> torch.Tensor:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                halves = v.chunk(2, dim=-1)  # two (B, H, N, d) views
                sdpa = F.scaled_dot_product_attention
                o1 = torch.cat([sdpa(q1, k1, h, is_causal=causal) for h in halves], -1)
                o2 = torch.cat([sdpa(q2, k2, h, is_causal=causal) for h in halves], -1)
            return o1 - lam * o2

        return run, leaves
    raise ValueError(f"unknown method {method!r}")


def bench_one(method: str, batch: int, seqlen: int, dim: int, width: int, dtype: torch.dtype, causal: bool,
              warmup: int, repeats: int) -> dict:
    row = dict(method=method, batch=batch, seqlen=seqlen, head_dim=width, causal=causal)
    fwd_flops = attention_flops(batch, dim // width, seqlen, width, causal)
    if method != "sdpa_standard":
        fwd_flops *= 1.5
    try:
        fn, leaves = make_problem(method, batch, seqlen, dim, width, dtype, causal)
        with torch.no_grad():
            row["fwd_ms"] = time_ms(fn, warmup, repeats)
        grad = torch.randn_like(fn())

        def fwd_bwd() -> None:
            torch.autograd.grad(fn(), leaves, grad)

        torch.cuda.reset_peak_memory_stats()
        row["fwd_bwd_ms"] = time_ms(fwd_bwd, warmup, repeats)
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        row["fwd_tflops"] = fwd_flops / row["fwd_ms"] / 1e9
        row["fwd_bwd_tflops"] = 3.5 * fwd_flops / row["fwd_bwd_ms"] / 1e9
    except (torch.cuda.OutOfMemoryError, RuntimeError, ValueError) as e:
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    finally:
        torch.cuda.empty_cache()
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| d | causal | N | B | method | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | GiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['head_dim']} | {int(r['causal'])} | {r['seqlen']} | {r['batch']} | {r['method']} "
        if "error" in r:
            lines.append(head + f"| {r['error'][:60]} | | | | |")
        else:
            lines.append(head + f"| {r['fwd_ms']:.3f} | {r['fwd_tflops']:.1f} | {r['fwd_bwd_ms']:.3f} | "
                         f"{r['fwd_bwd_tflops']:.1f} | {r['peak_mem_gib']:.2f} |")
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
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = p.parse_args(argv)

    if not torch.cuda.is_available():
        sys.exit("benchmarks/kernel.py times CUDA kernels and needs a CUDA GPU; none is available here.")

    rows = []
    for width in args.head_dims:
        for causal in map(bool, args.causal):
            for seqlen in args.seqlens:
                batch = max(1, args.tokens // seqlen)
                for method in args.methods:
                    row = bench_one(method, batch, seqlen, args.dim, width, DTYPES[args.dtype], causal,
                                    args.warmup, args.repeats)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)

    import triton

    result = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        dtype=args.dtype, tokens=args.tokens, dim=args.dim,
        flop_convention="standard fwd = 4·B·h·N²·d (halved if causal), bwd = 2.5× fwd, diff = 1.5× standard",
        rows=rows,
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    if args.markdown:
        print(f"{result['device']}, {args.dtype}, B·N = {args.tokens}, D = {args.dim} "
              f"(torch {torch.__version__}, triton {triton.__version__})\n")
        print(markdown(rows))


if __name__ == "__main__":
    main()
