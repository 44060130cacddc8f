"""Speed and memory of differential attention against standard SDPA attention, on the machine at hand.

For N from 256 to 16384 at a fixed number of tokens B·N, times forward+backward and measures peak memory of
- ``standard``: ``diffattn.Attention`` (PyTorch's fused SDPA kernels), the baseline of every ratio;
- ``diff[<backend>]``: ``diffattn.DiffAttention`` on the ``auto``, ``sdpa`` and ``math`` backends;
- ``naive``: a module in the style of DiffCLIP's reference DiffAttention (Hammoud & Ghanem 2025, released
  code), which materialises the (B, 2H, N, N) maps;
then one pre-norm transformer block (attention + MLP) both ways at N = 197 and N = 1024. Every ratio is taken in
the same run against the baseline. Peak memory is the process's resident-set high-water mark above its level
before the call (CPU) or ``torch.cuda.max_memory_allocated`` (CUDA).

    python benchmarks/attention.py --markdown docs/benchmarks.md --json benchmarks/results/attention_cpu.json

``--training`` instead times the training of one causal layer (forward + backward) at width 512, 8 heads,
B·N = 8192, N = 1024 and 4096: ``standard``, ``diff[auto]`` (on a CPU: query blocks with the two maps combined
before the product by V, :mod:`diffattn.ops.blockwise`) and ``diff[padded]`` (the two zero-padded fused calls
``sdpa`` makes otherwise). Repeats are interleaved (standard, auto, padded, standard, …) and the median is taken;
peak memory is measured in a fresh process per cell.

    python benchmarks/attention.py --training --markdown docs/benchmarks.md --json benchmarks/results/training_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from diffattn import Attention, DiffAttention
from diffattn.utils import MALLOC_ENV, cpu_name, peak_memory_mb, write_markdown_section


class NaiveDiffAttention(nn.Module):
    """DiffCLIP's reference module (Hammoud & Ghanem 2025, released code): both softmax maps materialised, (A1 − λ A2) V
    by matmul."""

    def __init__(self, dim: int, num_heads: int, lambda_init: float = 0.8):
        super().__init__()
        self.h, self.d = num_heads // 2, dim // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))
        self.diff_norm = nn.RMSNorm(2 * self.d, eps=1e-5)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(self.d) * 0.1) for _ in range(4))
        self.lambda_init = lambda_init

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        q = self.q_proj(x).view(B, N, 2 * self.h, self.d).transpose(1, 2) * self.d**-0.5
        k = self.k_proj(x).view(B, N, 2 * self.h, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, N, self.h, 2 * self.d).transpose(1, 2)
        a = F.softmax(q @ k.transpose(-1, -2), dim=-1).view(B, self.h, 2, N, N)  # (B, H, 2, N, N)
        lam = (torch.exp((self.lambda_q1 * self.lambda_k1).sum()) - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
               + self.lambda_init)
        o = (a[:, :, 0] - lam * a[:, :, 1]) @ v  # (B, H, N, 2d)
        o = self.diff_norm(o) * (1 - self.lambda_init)
        return self.out_proj(o.transpose(1, 2).reshape(B, N, D))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), then x + MLP(LN(x)) with a ×4 GELU MLP."""

    def __init__(self, attn: nn.Module, dim: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = attn
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def fwd_bwd(module: nn.Module, x: torch.Tensor):
    def run():
        module.zero_grad(set_to_none=True)
        out = module(x)
        out.float().square().mean().backward()
        _sync(x.device.type)

    return run


PHASE = "all"  # "time" in the parent process on a CPU, "memory" in its child (see main)


def measure(run, device: str, repeats: int) -> tuple[float, float | None]:
    """(median seconds, peak MiB) of ``run``; one warm-up call first."""
    run()
    peak = None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    elif PHASE != "time":
        peak = peak_memory_mb(run)
    if PHASE == "memory":
        return float("nan"), peak
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), peak


def naive_bytes(B: int, N: int, heads: int, itemsize: int) -> int:
    """Lower bound on the naive module's N×N tensors kept for backward: scores, probs and the difference."""
    return 4 * B * heads * N * N * itemsize


def available_bytes(device: str) -> int:
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return free
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 * 2**30


def machine(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    return f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads (torch {torch.__version__})"


def attention_sweep(args, device, dtype) -> list[dict]:
    rows = []
    for N in args.seq:
        B = max(1, args.tokens // N)
        x = torch.randn(B, N, args.dim, device=device, dtype=dtype, requires_grad=True)
        cases = {"standard": lambda: Attention(args.dim, args.heads)}
        for backend in args.backends:
            cases[f"diff[{backend}]"] = lambda b=backend: DiffAttention(args.dim, args.heads, backend=b)
        cases["naive"] = lambda: NaiveDiffAttention(args.dim, args.heads)
        base_t = base_m = None
        for name, build in cases.items():
            row = {"N": N, "B": B, "module": name}
            materialises = name in ("naive", "diff[math]")
            need = naive_bytes(B, N, args.heads, 4)
            if materialises and need > 0.5 * available_bytes(device):
                row["skipped"] = f"needs > {need / 2**30:.0f} GiB of N×N maps"
                rows.append(row)
                print(f"N={N:6d} {name:12s} skipped: {row['skipped']}", flush=True)
                continue
            torch.manual_seed(0)
            m = build().to(device=device, dtype=dtype)
            repeats = args.repeats if N <= 4096 else 1
            t, peak = measure(fwd_bwd(m, x), device, repeats)
            if name == "standard":
                base_t, base_m = t, peak
            row.update(seconds=t, peak_mib=peak, time_ratio=t / base_t,
                       memory_ratio=(peak / base_m) if peak is not None and base_m else None)
            rows.append(row)
            print(f"N={N:6d} {name:12s} {t * 1e3:9.1f} ms  x{row['time_ratio']:.2f}  peak {peak} MiB", flush=True)
            del m
    return rows


def block_sweep(args, device, dtype) -> list[dict]:
    rows = []
    for N, B in ((197, 32), (1024, 8)):
        x = torch.randn(B, N, args.block_dim, device=device, dtype=dtype, requires_grad=True)
        base = None
        for name, attn_cls in (("standard", Attention), ("diff[auto]", DiffAttention)):
            torch.manual_seed(0)
            blk = Block(attn_cls(args.block_dim, args.block_heads), args.block_dim).to(device=device, dtype=dtype)
            t, peak = measure(fwd_bwd(blk, x), device, args.repeats)
            base = base or (t, peak)
            rows.append({"N": N, "B": B, "module": f"block {name}", "seconds": t, "peak_mib": peak,
                         "time_ratio": t / base[0], "memory_ratio": peak / base[1] if peak and base[1] else None})
            print(f"block N={N:5d} B={B:3d} {name:12s} {t * 1e3:8.1f} ms  x{t / base[0]:.2f}", flush=True)
    return rows


TRAINING = {"seq": [1024, 4096], "tokens": 8192, "dim": 512, "heads": 8, "repeats": 5}


def training_module(name: str, dim: int, heads: int) -> nn.Module:
    """One causal layer of the training table: ``standard``, ``diff[auto]`` or ``diff[padded]``."""
    torch.manual_seed(0)
    if name == "standard":
        return Attention(dim, heads, causal=True)
    return DiffAttention(dim, heads, causal=True)


def training_run(name: str, module: nn.Module, x: torch.Tensor):
    """fwd+bwd of ``module``; ``diff[padded]`` turns the blockwise training path off for its own calls."""
    from diffattn.ops import functional

    step = fwd_bwd(module, x)
    if name != "diff[padded]":
        return step
    blockwise = functional._blockwise_preferred

    def run():
        functional._blockwise_preferred = lambda *a: False
        try:
            step()
        finally:
            functional._blockwise_preferred = blockwise

    return run


TRAINING_MODULES = ("standard", "diff[auto]", "diff[padded]")


def training_peak(args, N: int, name: str) -> float | None:
    """Peak MiB of one fwd+bwd after a warm-up, in a fresh process with :data:`MALLOC_ENV` (one per cell)."""
    argv = [sys.executable, __file__, "--training", "--phase", "memory", "--cell", f"{N}:{name}",
            "--tokens", str(args.tokens), "--dim", str(args.dim), "--heads", str(args.heads),
            "--dtype", args.dtype, "--device", args.device]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    res = subprocess.run(argv, env={**os.environ, **MALLOC_ENV}, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def training_sweep(args, device, dtype) -> list[dict]:
    if args.phase == "memory":  # child: one cell
        N, name = args.cell.split(":", 1)
        N = int(N)
        x = torch.randn(max(1, args.tokens // N), N, args.dim, device=device, dtype=dtype, requires_grad=True)
        run = training_run(name, training_module(name, args.dim, args.heads).to(device, dtype), x)
        run()
        print(json.dumps(peak_memory_mb(run)))
        return []
    rows = []
    for N in args.seq:
        B = max(1, args.tokens // N)
        x = torch.randn(B, N, args.dim, device=device, dtype=dtype, requires_grad=True)
        runs = {n: training_run(n, training_module(n, args.dim, args.heads).to(device, dtype), x)
                for n in TRAINING_MODULES}
        for run in runs.values():
            run()  # warm-up
        times = {n: [] for n in runs}
        for _ in range(args.repeats):
            for n, run in runs.items():
                _sync(device)
                t0 = time.perf_counter()
                run()
                _sync(device)
                times[n].append(time.perf_counter() - t0)
        peaks = {}
        for n in runs:
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                runs[n]()
                peaks[n] = (torch.cuda.max_memory_allocated() - base) / 2**20
            else:
                peaks[n] = training_peak(args, N, n)
        base_t, base_m = statistics.median(times["standard"]), peaks["standard"]
        for n in runs:
            t = statistics.median(times[n])
            row = {"N": N, "B": B, "module": n, "seconds": t, "peak_mib": peaks[n], "time_ratio": t / base_t,
                   "memory_ratio": peaks[n] / base_m if peaks[n] is not None and base_m else None,
                   "all_seconds": times[n]}
            rows.append(row)
            print(f"N={N:5d} {n:13s} {t * 1e3:9.1f} ms  x{row['time_ratio']:.2f}  peak {peaks[n]} MiB "
                  f"x{row['memory_ratio'] or float('nan'):.2f}", flush=True)
        del runs
    return rows


def training_command() -> str:
    """The command line, with the OpenMP settings of the environment that change how threads wait."""
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY") if k in os.environ)
    return (env + " " if env else "") + "python " + " ".join(sys.argv)


def training_markdown(rows: list[dict], args, device: str) -> str:
    lines = ["## Training one layer, " + device, "",
             f"Machine: {machine(device)}. dtype {args.dtype}; one causal layer, width {args.dim}, {args.heads} "
             f"heads (standard; differential: {args.heads // 2} heads of width 2d), B·N = {args.tokens} tokens; "
             f"forward + backward (loss = mean of the squared output); median of {args.repeats} interleaved "
             f"repeats after one warm-up each; peak memory in a fresh process per cell.", "",
             "Command:", "", "```", training_command(), "```", "",
             "| N | B | module | fwd+bwd ms | × standard | peak MiB | memory × standard |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        peak = "—" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        mem = "—" if r["memory_ratio"] is None else f"{r['memory_ratio']:.2f}"
        lines.append(f"| {r['N']} | {r['B']} | {r['module']} | {r['seconds'] * 1e3:.1f} | {r['time_ratio']:.2f} | "
                     f"{peak} | {mem} |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict], args, device: str, title: str) -> str:
    def fmt(v, spec):
        return "—" if v is None else format(v, spec)

    lines = [f"## {title}", "",
             f"Machine: {machine(device)}. dtype {args.dtype}; layer width {args.dim}, {args.heads} heads "
             f"(standard head count; differential layers use {args.heads // 2} heads of width 2d); "
             f"B·N = {args.tokens} tokens; forward + backward; median of {args.repeats} "
             f"(1 for N > 4096). Blocks: width {args.block_dim}, {args.block_heads} heads, MLP ×4.", "",
             "Command:", "", "```", "python " + " ".join(sys.argv), "```", "",
             "| N | B | module | fwd+bwd ms | × standard | peak MiB | memory × standard |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['N']} | {r['B']} | {r['module']} | skipped: {r['skipped']} | | | |")
            continue
        lines.append(f"| {r['N']} | {r['B']} | {r['module']} | {r['seconds'] * 1e3:.1f} | {r['time_ratio']:.2f} | "
                     f"{fmt(r['peak_mib'], '.0f')} | {fmt(r['memory_ratio'], '.2f')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--training", action="store_true", help="the training table of one causal layer instead")
    p.add_argument("--seq", type=int, nargs="+", default=None, help="default 256 1024 4096 16384 (training: "
                   "1024 4096)")
    p.add_argument("--tokens", type=int, default=None, help="B·N, fixed across N; default 16384 (training: 8192)")
    p.add_argument("--dim", type=int, default=None, help="default 256 (training: 512)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    p.add_argument("--block-dim", type=int, default=384)
    p.add_argument("--block-heads", type=int, default=6)
    p.add_argument("--backends", nargs="+", default=["auto", "sdpa", "math"])
    p.add_argument("--repeats", type=int, default=None, help="default 3 (training: 5)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, default=None, help="write all rows as JSON here")
    p.add_argument("--markdown", type=Path, default=None, help="update this markdown file's section")
    p.add_argument("--phase", default=None, choices=["memory"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = TRAINING if args.training else {"seq": [256, 1024, 4096, 16384], "tokens": 16384, "dim": 256,
                                                "repeats": 3}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    device = args.device
    if args.training:
        rows = training_sweep(args, device, dtype)
        if args.phase == "memory":
            return
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"machine": machine(device), "command": training_command(),
                                             "rows": rows}, indent=1))
        text = training_markdown(rows, args, device)
        print(text)
        if args.markdown:
            write_markdown_section(args.markdown, f"training-{device}", text)
        return
    global PHASE
    if args.phase == "memory":  # child: peaks only, printed as JSON on the last line
        PHASE = "memory"
        rows = attention_sweep(args, device, dtype) + block_sweep(args, device, dtype)
        print(json.dumps({f"{r['N']}/{r['module']}": r.get("peak_mib") for r in rows}))
        return
    peaks = {}
    if device == "cpu":  # peak RSS is exact only in a process started with a fixed mmap threshold
        PHASE = "time"
        child = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--phase", "memory"]
        res = subprocess.run(child, env={**os.environ, **MALLOC_ENV}, capture_output=True, text=True, check=True)
        peaks = json.loads(res.stdout.strip().splitlines()[-1])
    rows = attention_sweep(args, device, dtype) + block_sweep(args, device, dtype)
    for r in rows:
        key = f"{r['N']}/{r['module']}"
        if key in peaks:
            r["peak_mib"] = peaks[key]
    for group in ({r["N"] for r in rows if not r["module"].startswith("block")}, {197, 1024}):
        for N in group:
            prefix = "block " if group == {197, 1024} else ""
            sel = [r for r in rows if r["N"] == N and r["module"].startswith(prefix) and "skipped" not in r
                   and (prefix or not r["module"].startswith("block"))]
            base = next((r for r in sel if r["module"] == prefix + "standard"), None)
            for r in sel:
                if base and base.get("peak_mib") and r.get("peak_mib") is not None:
                    r["memory_ratio"] = r["peak_mib"] / base["peak_mib"]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": machine(device), "args": vars(args) | {
            "json": str(args.json), "markdown": str(args.markdown)}, "rows": rows}, indent=1))
    text = markdown(rows, args, device, f"Attention layers, {device}")
    print(text)
    if args.markdown:
        write_markdown_section(args.markdown, f"attention-{device}", text)


if __name__ == "__main__":
    main()
