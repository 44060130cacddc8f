"""The GPU goals' measurements, one mode per table: attention-core baselines, whole models, decoding.

    core    forward+backward time and peak memory of the attention core, bf16, d = 64 and 128, causal and not,
            N = 1k … 16k at B·N = 16384 tokens, model width 2048: standard attention on each SDPA backend the card
            offers (std_flash, std_cudnn, std_efficient; the fastest per shape is the reference), diffattn's
            ``sdpa`` path (diff_sdpa), the fused kernel (diff_triton), the four-call split-V recipe (diff_split4:
            V in halves, four standard calls on the fastest backend) and the unilm-style naive module with
            materialised maps (naive, N ≤ --naive-max), a floor. Ratios against the fastest standard backend.
    models  training throughput (forward + backward + AdamW, bf16 autocast) of DiffViT-B/16, DiffCLIP-B/16 and a
            ~125M-parameter Diff Transformer LM (head width 128, N 2048) against their standard twins at the same
            batch: eager, ``torch.compile(fullgraph=True)`` and, for the LM, ``mode="reduce-overhead"``.
    decode  per-token greedy decoding with the static cache, batch 1 and 8, prefix 2k and 8k: the V1, V2 and
            gated LMs against the standard LM (benchmarks/decode.py's models and caches), the standard and V1 LMs
            also under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), and a DAA-retrofitted Llama
            against its base (transformers' StaticCache).

``--dry-run`` runs every mode on whatever device there is (the CPU here) at tiny shapes for 1–2 iterations and writes
the same JSON, so that a broken mode shows before device time is spent; compiled rows then use
``backend="eager"`` (dynamo's whole-graph capture without inductor's minutes of compilation on 2 cores).
benchmarks/gpu_check.py runs the modes and renders the tables.

    python benchmarks/gpu_goals.py core --out core.json
    python benchmarks/gpu_goals.py models --dry-run --out models.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from diffattn.ops import diff_attention  # noqa: E402

LAMBDA = 0.8
STD_BACKENDS = {"std_flash": "FLASH_ATTENTION", "std_cudnn": "CUDNN_ATTENTION", "std_efficient": "EFFICIENT_ATTENTION",
                "std_math": "MATH"}
DIFF_METHODS = ("diff_sdpa", "diff_triton", "diff_triton_split", "diff_split4", "naive")
#: the differential paths whose best time the core goal is judged on (the naive module is a floor, not a path)
BEST_DIFF = ("diff_triton", "diff_triton_split", "diff_sdpa", "diff_split4")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_ms(fn: Callable[[], object], dev: torch.device, warmup: int, reps: int) -> float:
    """Median wall time of ``fn`` in ms, synchronised around each call."""
    for _ in range(warmup):
        fn()
    sync(dev)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def peak_mib(fn: Callable[[], object], dev: torch.device) -> float | None:
    if dev.type != "cuda":
        return None
    sync(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    fn()
    sync(dev)
    return (torch.cuda.max_memory_allocated(dev) - base) / 2**20


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def header(dev: torch.device, command: str) -> dict:
    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = None
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (dry run)"
    return dict(device=name, torch=torch.__version__, triton=tv, cuda=torch.version.cuda, command=command, rows=[])


def save(result: dict, out: Path | None) -> None:
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))


# ------------------------------------------------------------------------------------------------------- core


def _naive(q1, k1, q2, k2, v, causal: bool) -> torch.Tensor:
    """unilm's naive MultiheadDiffAttn core: both attention maps materialised, subtracted, then times V."""
    scale = q1.shape[-1] ** -0.5
    n = q1.shape[-2]
    a1 = (q1 @ k1.transpose(-1, -2)) * scale
    a2 = (q2 @ k2.transpose(-1, -2)) * scale
    if causal:
        mask = torch.ones(n, n, dtype=torch.bool, device=q1.device).triu(1)
        a1, a2 = a1.masked_fill(mask, float("-inf")), a2.masked_fill(mask, float("-inf"))
    a = F.softmax(a1.float(), -1).type_as(v) - LAMBDA * F.softmax(a2.float(), -1).type_as(v)
    return a @ v


def core_problem(method: str, batch: int, seqlen: int, dim: int, width: int, dtype, causal: bool, dev,
                 std_backend: str | None):
    """(closure, leaves) of one layer's attention core."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)

    def rnd(heads: int, w: int) -> torch.Tensor:
        return torch.randn(batch, heads, seqlen, w, device=dev, dtype=dtype, requires_grad=True)

    h = dim // width
    sdpa = F.scaled_dot_product_attention
    if method in STD_BACKENDS:
        q, k, v = rnd(h, width), rnd(h, width), rnd(h, width)
        be = getattr(SDPBackend, STD_BACKENDS[method])

        def standard():
            with sdpa_kernel(be):
                return sdpa(q, k, v, is_causal=causal)

        return standard, [q, k, v]
    H = max(1, h // 2)
    q1, k1, q2, k2, v = rnd(H, width), rnd(H, width), rnd(H, width), rnd(H, width), rnd(H, 2 * width)
    leaves = [q1, k1, q2, k2, v]
    if method in ("diff_sdpa", "diff_triton", "diff_triton_split"):
        backend = "sdpa" if method == "diff_sdpa" else "triton"
        return (lambda: diff_attention(q1, k1, q2, k2, v, LAMBDA, is_causal=causal, backend=backend)), leaves
    if method == "diff_split4":
        if std_backend is None:
            raise RuntimeError("no standard backend ran at this shape")
        be = getattr(SDPBackend, STD_BACKENDS[std_backend])

        def four():
            with sdpa_kernel(be):
                halves = v.chunk(2, dim=-1)
                o1 = torch.cat([sdpa(q1, k1, x, is_causal=causal) for x in halves], -1)
                o2 = torch.cat([sdpa(q2, k2, x, is_causal=causal) for x in halves], -1)
            return o1 - LAMBDA * o2

        return four, leaves
    if method == "naive":
        return (lambda: _naive(q1, k1, q2, k2, v, causal)), leaves
    raise ValueError(method)


def core_row(method, batch, seqlen, dim, width, dtype, causal, dev, warmup, reps, std_backend=None) -> dict:
    row = dict(method=method, batch=batch, seqlen=seqlen, head_dim=width, causal=causal)
    if std_backend and method == "diff_split4":
        row["backend"] = std_backend
    try:
        with _split(method, width):
            _time_core(row, method, batch, seqlen, dim, width, dtype, causal, dev, warmup, reps, std_backend)
    except Exception as e:  # noqa: BLE001 - a backend the card lacks, out of memory: reported per row
        row["error"] = _err(e)
    finally:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return row


def _split(method: str, width: int):
    """``diff_triton_split``: the fused kernel with its dK/dV backward as two launches (dV, then dK)."""
    if method != "diff_triton_split":
        return contextlib.nullcontext()
    from diffattn.ops.kernels.triton_diff import split_dkdv

    return split_dkdv(width, 2 * width)


def _time_core(row, method, batch, seqlen, dim, width, dtype, causal, dev, warmup, reps, std_backend) -> None:
    """Forward and forward + backward times and the peak memory of one method, into ``row``."""
    fn, leaves = core_problem(method, batch, seqlen, dim, width, dtype, causal, dev, std_backend)
    with torch.no_grad():
        row["fwd_ms"] = time_ms(fn, dev, warmup, reps)
    grad = torch.randn_like(fn())

    def fwd_bwd():
        torch.autograd.grad(fn(), leaves, grad)

    fwd_bwd()
    row["peak_mib"] = peak_mib(fwd_bwd, dev)
    row["fwd_bwd_ms"] = time_ms(fwd_bwd, dev, warmup, reps)


def run_core(args, dev, result) -> None:
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    stds = [m for m in args.std if m in STD_BACKENDS]
    result.update(tokens=args.tokens, dim=args.dim, dtype=str(dtype).removeprefix("torch."))
    for width in args.head_dims:
        for causal in map(bool, args.causal):
            for n in args.seqlens:
                batch = max(1, args.tokens // n)
                rows = [core_row(m, batch, n, args.dim, width, dtype, causal, dev, args.warmup, args.reps)
                        for m in stds]
                ok = [r for r in rows if "error" not in r]
                fastest = min(ok, key=lambda r: r["fwd_bwd_ms"])["method"] if ok else None
                for m in DIFF_METHODS:
                    if m == "naive" and n > args.naive_max:
                        continue
                    if m == "diff_triton_split" and width < 128 and not args.dry_run:  # an option for wide values
                        continue
                    rows.append(core_row(m, batch, n, args.dim, width, dtype, causal, dev, args.warmup, args.reps,
                                         fastest))
                for r in rows:
                    r["reference"] = fastest
                    print(json.dumps(r), flush=True)
                result["rows"] += rows
                save(result, args.out)


def write_dispatch(path: Path, result: dict, dev: torch.device, command: str) -> None:
    """backend='auto''s dispatch table with this card's entries (diffattn.ops.dispatch.entries_from_core_rows)."""
    from diffattn.ops import dispatch as _dispatch

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
    measured = f"{command}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
    entries = _dispatch.entries_from_core_rows(result["rows"], name, result["dtype"], measured)
    result["dispatch_entries"] = entries
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_dispatch.merge_entries(path if path.exists() else None, entries), indent=1) + "\n")


# ------------------------------------------------------------------------------------------------------ models

#: pair → ((standard name, overrides), (differential name, overrides), train.py family kind, batch, LM length)
MODEL_PAIRS = {
    "vit_b16": (("vit_base_patch16_224", {}), ("diff_vit_base_patch16_224", {}), "vit", 64, 0),
    "clip_b16": (("clip_vit_b16", {}), ("diffclip_vit_b16", {}), "clip", 64, 0),
    # 12 × 768, 6 heads of width 128, tied embeddings: ~124M parameters
    "lm_125m": (("lm_base", {"num_heads": 6, "tie_embeddings": True}),
                ("diff_lm_base", {"num_heads": 6, "tie_embeddings": True}), "lm", 8, 2048),
}
DRY_PAIRS = {
    "vit_b16": (("vit_cifar", {"depth": 1}), ("vit_cifar", {"attention": "diff", "depth": 1}), "vit", 2, 0),
    "clip_b16": (("clip_tiny", {}), ("diffclip_tiny", {}), "clip", 2, 0),
    "lm_125m": (("lm_tiny", {}), ("diff_lm_tiny", {}), "lm", 2, 16),
}


def run_models(args, dev, result) -> None:
    from train import make_step

    pairs = DRY_PAIRS if args.dry_run else MODEL_PAIRS
    amp = torch.bfloat16 if dev.type == "cuda" else None
    cbackend = "eager" if args.dry_run else "inductor"
    result.update(precision="bf16 autocast" if amp else "fp32", steps=args.steps, rounds=args.rounds,
                  compile_backend=cbackend)
    for pair in args.pairs:
        std_spec, diff_spec, kind, batch, seq = pairs[pair]
        modes = ["eager", "compiled"] + (["reduce-overhead"] if kind == "lm" else [])
        for mode in modes:
            if mode not in args.modes:
                continue
            if mode == "eager":
                wrap = None
            else:
                kw = dict(fullgraph=True, backend=cbackend)
                if mode == "reduce-overhead" and cbackend == "inductor":
                    kw["mode"] = "reduce-overhead"

                def wrap(m, kw=kw):
                    return torch.compile(m, **kw)
            steps, rows = {}, {}
            for attention, (name, over) in (("standard", std_spec), ("diff", diff_spec)):
                row = dict(pair=pair, mode=mode, attention=attention, batch=batch, seq=seq or None,
                           model=name + "".join(f" {k}={v}" for k, v in over.items()))
                rows[attention] = row
                try:
                    if dev.type == "cuda":
                        torch._dynamo.reset()
                    t0 = time.perf_counter()
                    step, n = make_step(kind, name, over, batch, seq, dev, amp, wrap=wrap)
                    for _ in range(max(1, args.warmup)):
                        step()
                    sync(dev)
                    row["params"], row["warmup_s"] = n, time.perf_counter() - t0
                    steps[attention] = step
                except Exception as e:  # noqa: BLE001 - a model that does not compile is reported, not fatal
                    row["error"] = _err(e)
            times = {a: [] for a in steps}
            for _ in range(args.rounds):  # interleaved, so that a slow-down of the machine hits both alike
                for a, step in steps.items():
                    try:
                        times[a].append(time_ms(step, dev, 0, args.steps))
                    except Exception as e:  # noqa: BLE001
                        rows[a]["error"] = _err(e)
            for a, t in times.items():
                if t and "error" not in rows[a]:
                    rows[a]["step_ms"] = statistics.median(t)
                    rows[a]["samples_s"] = 1e3 * batch / rows[a]["step_ms"]
            s, d = rows["standard"], rows["diff"]
            if "samples_s" in s and "samples_s" in d:
                d["vs_standard"] = d["samples_s"] / s["samples_s"]
            for r in rows.values():
                print(json.dumps(r), flush=True)
                result["rows"].append(r)
            del steps
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            save(result, args.out)


# ------------------------------------------------------------------------------------------------------ decode


def run_decode(args, dev, result) -> None:
    import decode as dec

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    size = dict(dim=64, depth=2) if args.dry_run else {}  # a dry run checks the step, at a tiny width and depth
    models = {k: m.to(dev, dtype) for k, m in dec.build_lms(**size).items()}
    llamas = None if args.no_hf else dec.build_llamas(**size)
    if llamas:
        models.update({k: m.to(dev, dtype) for k, m in llamas.items()})
    graphs = ("standard", "diff")
    result.update(dtype=str(dtype).removeprefix("torch."), tokens=args.tokens, rounds=args.rounds)
    cbackend = "eager" if args.dry_run else "inductor"
    prompt = min(args.prefixes)
    ids = torch.randint(0, 32000, (1, prompt), generator=torch.Generator().manual_seed(0)).to(dev)
    src, first = {}, {}
    longest = max(args.prefixes) + args.tokens + 1
    with torch.no_grad():
        for label, m in models.items():
            try:
                _, src[label], first[label] = dec.prefill(label, m, ids, longest)
            except Exception as e:  # noqa: BLE001
                result["rows"].append(dict(model=label, error=f"prefill: {_err(e)}"))

    def one_token(label, fwd, cache, tok):
        if label.startswith("llama"):
            return fwd(input_ids=tok, cache=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        return fwd(tok, kv_caches=cache)[:, -1].argmax(-1, keepdim=True)

    compiled = {}
    for prefix in args.prefixes:
        for batch in args.batches:
            cells = [(k, False) for k in models if k in src] + [(k, True) for k in graphs if k in src]
            per: dict = {c: [] for c in cells}
            errors: dict = {}
            with torch.no_grad():
                for _ in range(args.rounds):
                    for label, graph in cells:
                        if (label, graph) in errors:
                            continue
                        try:
                            m = models[label]
                            if graph and label not in compiled:
                                kw = dict(backend=cbackend) if cbackend == "eager" else dict(mode="reduce-overhead")
                                compiled[label] = torch.compile(m, **kw)
                            fwd = compiled[label] if graph else m
                            cache = dec.filled_cache(label, m, src[label], batch, prefix, prefix + args.tokens + 4)
                            tok = first[label].repeat(batch, 1)
                            tok = one_token(label, fwd, cache, tok)  # warm (and for graphs: record)
                            sync(dev)
                            times = []
                            for _ in range(args.tokens):
                                t0 = time.perf_counter()
                                tok = one_token(label, fwd, cache, tok)
                                sync(dev)
                                times.append(1e3 * (time.perf_counter() - t0))
                            per[(label, graph)].append(statistics.median(times))
                            del cache
                        except Exception as e:  # noqa: BLE001
                            errors[(label, graph)] = _err(e)
            rows = []
            for label, graph in cells:
                row = dict(prefix=prefix, batch=batch, model=label, graphs=graph)
                if (label, graph) in errors:
                    row["error"] = errors[(label, graph)]
                elif per[(label, graph)]:
                    row["ms"] = statistics.median(per[(label, graph)])
                rows.append(row)
            for r in rows:
                base_label = "llama" if r["model"].startswith("llama") else "standard"
                base = next((x for x in rows if x["model"] == base_label and x["graphs"] == r["graphs"]
                             and "ms" in x), None)
                if base and "ms" in r:
                    r["vs_standard"] = r["ms"] / base["ms"]
                print(json.dumps(r), flush=True)
            result["rows"] += rows
            save(result, args.out)


# -------------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("core", "models", "decode"))
    p.add_argument("--out", type=Path)
    p.add_argument("--dry-run", action="store_true", help="tiny shapes, 1–2 iterations, on any device")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # core
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--causal", type=int, nargs="+", choices=[0, 1], default=[0, 1])
    p.add_argument("--std", nargs="+", default=["std_flash", "std_cudnn", "std_efficient"])
    p.add_argument("--naive-max", type=int, default=4096, help="longest N for the naive module (N² maps)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--dispatch-out", type=Path, help="write backend='auto''s dispatch table here: the packaged "
                   "one (or this file's) with this card's entries from the diff_triton and diff_sdpa timings "
                   "(copy it to src/diffattn/ops/dispatch.json to ship it)")
    # models
    p.add_argument("--pairs", nargs="+", default=list(MODEL_PAIRS), choices=list(MODEL_PAIRS))
    p.add_argument("--modes", nargs="+", default=["eager", "compiled", "reduce-overhead"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    # decode
    p.add_argument("--prefixes", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--tokens-decode", dest="tokens_decode", type=int, default=32)
    p.add_argument("--no-hf", action="store_true")
    args = p.parse_args(argv)
    if args.dry_run:
        args.tokens, args.dim, args.seqlens, args.naive_max = 64, 256, [64], 64
        args.warmup, args.reps, args.steps, args.rounds = 1, 1, 1, 1
        args.prefixes, args.batches, args.tokens_decode = [16], [2], 2
        if args.std == p.get_default("std"):
            args.std = [*args.std, "std_math"]
    dev = torch.device(args.device)
    command = "python benchmarks/gpu_goals.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = header(dev, command)
    result.update(mode=args.mode, dry_run=args.dry_run)
    t0 = time.perf_counter()
    if args.mode == "core":
        run_core(args, dev, result)
        if args.dispatch_out is not None:
            write_dispatch(args.dispatch_out, result, dev, command)
    elif args.mode == "models":
        run_models(args, dev, result)
    else:
        args.tokens = args.tokens_decode
        run_decode(args, dev, result)
    result["seconds"] = time.perf_counter() - t0
    save(result, args.out)
    print(f"# {args.mode}: {len(result['rows'])} rows in {result['seconds']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
