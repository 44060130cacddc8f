"""torch.compile(fullgraph=True) of whole models with the fused kernel inside, against eager: training-step time.

The fused kernel is a PyTorch operator (torch.library.custom_op, with a fake implementation), so dynamo traces a
differential model into one graph and inductor compiles everything around the kernel (projections, RMSNorm, λ, MLP),
calling the kernel as an opaque node in the forward and its backward operator in the backward. This script
checks that on a GPU (one graph: ``fullgraph=True`` raises on any graph break; the kernel runs inside it: its
launcher is counted; the compiled loss and gradients agree with eager) and times forward+backward, eager and
compiled, for standard, differential and gated ViT-B/16-width models under bf16 autocast.

    python benchmarks/compiled.py --depth 4 --batch 64 --json compiled.json
    python benchmarks/compiled.py --render compiled.json --markdown docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import diffattn  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

MODELS = ("vit_base_patch16_224", "diff_vit_base_patch16_224", "dg_vit_base_patch16_224")


def time_steps(step, n: int) -> list[float]:
    """Times of ``n`` calls in ms (CUDA events around each)."""
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return out


def bench_model(name: str, depth: int, batch: int, steps: int, warmup: int) -> dict:
    from diffattn.models import create_model
    from diffattn.ops.kernels import triton_diff as td

    torch.manual_seed(0)
    model = create_model(name, depth=depth).cuda().train()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 224, 224, generator=g).cuda()
    y = torch.randint(0, model.num_classes, (batch,), generator=g).cuda()
    params = [p for p in model.parameters() if p.requires_grad]

    def run(m) -> tuple[float, torch.Tensor]:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(m(x).float(), y)
        grads = torch.autograd.grad(loss, params)
        return loss.detach(), torch.cat([gr.flatten() for gr in grads])

    row = dict(model=name, depth=depth, batch=batch)
    calls = []
    real = td._fwd_impl

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    td._fwd_impl = counting
    try:
        loss_e, grad_e = run(model)
        row["kernel_calls_eager"] = len(calls)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        t0 = time.perf_counter()
        calls.clear()
        loss_c, grad_c = run(compiled)
        torch.cuda.synchronize()
        row["compile_s"] = time.perf_counter() - t0
        row["kernel_calls_compiled"] = len(calls)
    finally:
        td._fwd_impl = real
    row["loss_rel_err"] = (abs(loss_c - loss_e) / abs(loss_e)).item()
    row["grad_rel_err"] = ((grad_c - grad_e).norm() / grad_e.norm()).item()
    for m in (model, compiled):
        for _ in range(warmup):
            run(m)
    # interleaved rounds, so that a slow-down of the machine hits both alike
    times = {"eager": [], "compiled": []}
    for _ in range(3):
        for label, m in (("eager", model), ("compiled", compiled)):
            times[label] += time_steps(lambda m=m: run(m), steps)
    for label in times:
        row[f"{label}_ms"] = statistics.median(times[label])
    row["speedup"] = row["eager_ms"] / row["compiled_ms"]
    torch._dynamo.reset()
    return row


def markdown(result: dict) -> str:
    lines = [f"### torch.compile, {result['device']}", "",
             f"Device: {result['device']}, torch {result['torch']}, triton {result['triton']}; bf16 autocast; "
             f"ViT-B/16 width (768, 12 heads, 197 tokens) with {result['depth']} blocks, batch {result['batch']}; "
             "forward + backward of the cross-entropy loss (no optimizer); median of 3 interleaved rounds of "
             f"{result['steps']} steps. `torch.compile(model, fullgraph=True)` with the default inductor backend; "
             "kernel calls: launches of the fused kernel in the first compiled step (one per differential block "
             "means the kernel runs inside the compiled graph); compile s: that first compiled step (tracing, and "
             "compiling or loading from inductor's on-disk caches); errors: compiled against eager, relative L2.",
             "",
             "Command:", "", "```", result["command"], "```", "",
             "| model | eager ms | compiled ms | speed-up | compiled ÷ standard compiled | compile s | kernel calls | "
             "loss err | grad err |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    std = next((r for r in result["rows"] if r["model"] == MODELS[0] and "error" not in r), None)
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['error'][:100]} | | | | | | | |")
            continue
        rel = f"{r['compiled_ms'] / std['compiled_ms']:.2f}" if std else ""
        lines.append(f"| {r['model']} | {r['eager_ms']:.1f} | {r['compiled_ms']:.1f} | {r['speedup']:.2f}× | {rel} | "
                     f"{r['compile_s']:.0f} | {r['kernel_calls_compiled']} | {r['loss_rel_err']:.1e} | "
                     f"{r['grad_rel_err']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", type=Path)
    p.add_argument("--render", type=Path, help="do not measure: print (and with --markdown write) this result")
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    if args.render:
        result = json.loads(args.render.read_text())
        text = markdown(result)
        if args.markdown:
            from diffattn.utils import write_markdown_section

            write_markdown_section(args.markdown, "compile-gpu", text)
        print(text)
        return 0
    if not torch.cuda.is_available():
        sys.exit("benchmarks/compiled.py needs a CUDA GPU; none is available here.")
    import triton

    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  depth=args.depth, batch=args.batch, steps=args.steps, rows=[],
                  command="python benchmarks/compiled.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    for name in args.models:
        try:
            row = bench_model(name, args.depth, args.batch, args.steps, args.warmup)
        except Exception as e:  # noqa: BLE001 - one model's failure is reported, the others still run
            row = dict(model=name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
