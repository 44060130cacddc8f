"""Every GPU check of the project in one run, each step with its own time limit, continuing past failures.

Default steps and their time limits on an H100 (the whole run within 8 minutes; ``--budget 470`` s):
    phase A, side by side (100 s): pytest (tests/test_kernels.py and tests/test_train_gpu.py, ``-m "gpu or not
               gpu"``: half-precision kernel cases against float64, one bf16 training step per family) and host
               (benchmarks/host_ops.py on the CPU, recorded with the run's torch version)
    core       130 s  benchmarks/gpu_goals.py core: attention-core baselines, every SDPA backend, diffattn's sdpa
                      path, the fused kernel (at head width 128 also with its dK/dV backward split in two
                      launches), the four-call split-V recipe, the naive module; writes dispatch.json, backend
                      'auto''s table rewritten from these timings
    models     170 s  benchmarks/gpu_goals.py models: DiffViT-B/16, DiffCLIP-B/16, the ~125M Diff LM against their
                      standard twins, eager, compiled (fullgraph) and, for the LM, reduce-overhead
    decode      60 s  benchmarks/gpu_goals.py decode: static-cache decoding, V1/V2/gated LMs and DAA Llama
The earlier run's steps (compiled-warm, kernel, train, kernel-vit, compiled) are still available by name with
``--steps``. Each step continues past the failure of another; a step killed at its limit keeps what it wrote.

Writes to ``--out``: log (this driver's output), steps.json, steps.log, pytest.log, gpu_report.jsonl (the tests'
errors, GPU only), host_ops.json, core.json, dispatch.json, models.json, decode.json. ``--dry-run`` runs every step
on the CPU at tiny shapes (pytest collects only), writing the same files, in about a minute. ``--render DIR --markdown
docs/benchmarks.md`` writes the sections gpu-tests, gpu-core, gpu-models, gpu-decode and gpu-host, each goal
stated met, not met (with the failing shapes) or not measured.

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out "$OUT" 2>&1 | tee "$OUT/log"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the differential paths whose best time the core goal is judged on (benchmarks/gpu_goals.py's methods)
BEST_DIFF = ("diff_triton", "diff_triton_split", "diff_sdpa", "diff_split4")


class Step:
    """A command with a time limit, started now, its output in ``log``."""

    def __init__(self, name: str, cmd: list[str], log: Path, env: dict, limit: float):
        self.name, self.cmd, self.log, self.limit = name, cmd, log, limit
        self.t0 = time.perf_counter()
        self.fh = open(log, "w")
        self.fh.write(f"$ {' '.join(cmd)}   (limit {limit:.0f} s)\n")
        self.fh.flush()
        # a new session, so that a timeout ends the step and every process it started (compile workers)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        print(f"[{time.strftime('%H:%M:%S')}] start {name} (limit {limit:.0f} s)", flush=True)

    def wait(self) -> dict:
        try:
            rc = self.proc.wait(timeout=max(1.0, self.limit - (time.perf_counter() - self.t0)))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
            rc = "timeout"
        self.fh.close()
        took = time.perf_counter() - self.t0
        print(f"[{time.strftime('%H:%M:%S')}] end {self.name}: rc={rc} after {took:.0f} s", flush=True)
        return dict(step=self.name, rc=rc, seconds=round(took, 1))


def tail(path: Path, n: int) -> str:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(lines[-n:])


def render(out: Path, command: str) -> str:
    """The tests' part of docs/benchmarks.md from a run's files: pytest's outcome, the accuracy of the kernel
    against the float64 reference and the sdpa backend, and the training-step comparison."""
    log = (out / "pytest.log").read_text(errors="replace").splitlines() if (out / "pytest.log").exists() else []
    summary = next((ln.strip("= ") for ln in reversed(log)
                    if " passed" in ln or " failed" in ln or " collected" in ln), "not run")
    device = _device(out)
    failed = [ln for ln in log if ln.startswith("FAILED") or ln.startswith("ERROR")]
    report = out / "gpu_report.jsonl"
    records = [json.loads(ln) for ln in report.read_text().splitlines() if ln.strip()] if report.exists() else []
    lines = ["### GPU tests", "", f"Device: {device}. Command (the whole GPU run, every step below and the tables "
             "that follow):", "", "```", command, "```", "",
             f"`pytest tests/test_kernels.py tests/test_train_gpu.py -m \"gpu or not gpu\"`: **{summary}**.", ""]
    lines += [f"- {ln}" for ln in failed] + ([""] if failed else [])
    acc = sorted((r for r in records if r["kind"] == "accuracy"), key=lambda r: r["name"])
    if acc:
        lines += ["Kernel accuracy: ‖x − ref‖ / ‖ref‖ against the float64 reference (N = 16384: against the `sdpa` "
                  "backend in float32), worst over the output and the gradients of q1, k1, q2, k2, v and the tensor "
                  "weights; beside it the `sdpa` backend's own error on the same half-precision inputs. Tolerances: "
                  "bf16 2e-2, fp16 1e-2, and at most 2× the `sdpa` backend's + 1e-3.", "",
                  "| case | dtype | kernel: worst | of | `sdpa` backend: worst |", "|---|---|---:|---|---:|"]
        for r in acc:
            errs = r["errors"]
            worst = max(errs, key=lambda n: errs[n]["triton"])
            sd = [e["sdpa"] for e in errs.values() if "sdpa" in e]
            lines.append(f"| {r['name']} | {r['dtype'].removeprefix('torch.')} | {errs[worst]['triton']:.1e} | "
                         f"{worst} | {max(sd):.1e} |" if sd else
                         f"| {r['name']} | {r['dtype'].removeprefix('torch.')} | {errs[worst]['triton']:.1e} | "
                         f"{worst} | |")
        lines.append("")
    steps = [r for r in records if r["kind"] == "train_step"]
    if steps:
        order = {n: i for i, n in enumerate(
            ["vit", "clip", "text", "lm"])}
        steps.sort(key=lambda r: (order.get(r["family"], 9), r["name"]))
        lines += ["One training step per model family, CUDA bf16 autocast (the differential layers on the fused "
                  "kernel: launches counted) against the CPU in float32 (the `sdpa` backend), from the same weights "
                  "and batch: relative L2 errors of the loss, of all gradients flattened, and of the parameters "
                  "after one AdamW step (tolerances 1e-2, 5e-2, 1e-2; tests/test_train_gpu.py says why the last "
                  "is loose). The device has one GPU, so no FSDP2 or DDP run was made.", "",
                  "| family | model | kernel launches | loss err | grad err | grad cosine | param err |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r in steps:
            over = "".join(f" {k}={v}" for k, v in r.get("overrides", {}).items())
            lines.append(f"| {r['family']} | {r['name']}{over} | {r['kernel_calls']} | {r['loss']:.1e} | "
                         f"{r['grad']:.1e} | {r['grad_cos']:.6f} | {r['param']:.1e} |")
    return "\n".join(lines)


def _device(out: Path) -> str:
    log = out / "log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return next((ln.split("device: ", 1)[1].split(",")[0] for ln in lines if ln.startswith("device: ")), "?")


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _verdict(ok: list, bad: list, what: str) -> str:
    """The goal line: met / not met (with the failing cases) / not measured."""
    if not ok and not bad:
        return f"Goal ({what}): **not measured**."
    if not bad:
        return f"Goal ({what}): **met** ({len(ok)} of {len(ok)})."
    return (f"Goal ({what}): **not met** ({len(ok)} of {len(ok) + len(bad)}; failing: " + "; ".join(bad) + ").")


def _head(res: dict, title: str) -> list[str]:
    return [f"### {title}, {res['device']}", "",
            f"Device: {res['device']}; torch {res['torch']}, triton {res.get('triton')}, CUDA {res.get('cuda')}"
            + ("; **dry run** (tiny shapes on the CPU: the numbers check the script, they measure nothing)"
               if res.get("dry_run") else "") + ". Command:", "", "```", res["command"], "```", ""]


def render_core(res: dict | None) -> str:
    """Attention-core baselines; the goal: the best differential path's fwd+bwd ≤ 1.3× the fastest standard SDPA
    backend at head width 128, every shape."""
    goal = "best differential path fwd+bwd ≤ 1.3× the fastest standard SDPA backend, head width 128"
    if not res:
        return "### Attention-core baselines\n\n" + _verdict([], [], goal)
    rows = res["rows"]
    key = {(r["head_dim"], r["causal"], r["seqlen"], r["method"]): r for r in rows}
    lines = _head(res, "Attention-core baselines") + [
        f"{res.get('dtype')}, B·N = {res.get('tokens')} tokens, model width {res.get('dim')}; standard: width/d "
        "heads of width d on each SDPA backend (the fastest per shape is the reference); differential: half the "
        "heads, Q/K width d, V width 2d. Median wall time of synchronised calls; memory: peak allocated during one "
        "forward+backward above the inputs.", ""]
    ok, bad = [], []
    for (d, c, n, m), r in sorted(key.items()):
        if m != "diff_triton" or d != 128:
            continue
        ref = key.get((d, c, n, r.get("reference")))
        best = [key[(d, c, n, x)] for x in BEST_DIFF if "fwd_bwd_ms" in key.get((d, c, n, x), {})]
        if not ref or "fwd_bwd_ms" not in ref or not best:
            continue
        b = min(best, key=lambda x: x["fwd_bwd_ms"])
        ratio = b["fwd_bwd_ms"] / ref["fwd_bwd_ms"]
        tag = f"{'causal' if c else 'full'} N = {n}: {b['method']} {ratio:.2f}×"
        (ok if ratio <= 1.3 else bad).append(tag)
    lines += [_verdict(ok, bad, goal), "",
              "| d | causal | N | B | method | fwd ms | fwd+bwd ms | × fastest standard | peak MiB |",
              "|---:|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        head = f"| {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | {r['batch']} | {r['method']}"
        if r["method"] == r.get("reference"):
            head += " (reference)"
        if "fwd_bwd_ms" not in r:
            lines.append(head + f" | {r.get('error', '')[:90]} | | | |")
            continue
        ref = key.get((r["head_dim"], r["causal"], r["seqlen"], r.get("reference")))
        ratio = f"{r['fwd_bwd_ms'] / ref['fwd_bwd_ms']:.2f}" if ref and "fwd_bwd_ms" in ref else ""
        peak = f"{r['peak_mib']:.0f}" if r.get("peak_mib") is not None else ""
        lines.append(head + f" | {r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | {ratio} | {peak} |")
    entries = res.get("dispatch_entries")
    if entries:
        lines += ["", "backend='auto''s dispatch entries from these timings (`dispatch.json` in the run's folder; "
                  "copy it to src/diffattn/ops/dispatch.json to ship them): " + "; ".join(
                      f"value width {e['value_width']}: the fused kernel "
                      + ("at every length" if e["triton_below_keys"] is None else
                         f"below {e['triton_below_keys']} keys") for e in entries) + "."]
    return "\n".join(lines)


def render_models(res: dict | None) -> str:
    goal = "each differential model ≥ 0.93× its standard twin's samples/s, same batch, each mode"
    if not res:
        return "### Whole-model training throughput\n\n" + _verdict([], [], goal)
    rows = res["rows"]
    ok, bad = [], []
    for r in rows:
        if r["attention"] == "diff" and "vs_standard" in r:
            tag = f"{r['pair']} {r['mode']} {r['vs_standard']:.2f}×"
            (ok if r["vs_standard"] >= 0.93 else bad).append(tag)
        elif r["attention"] == "diff":
            bad.append(f"{r['pair']} {r['mode']}: no ratio ({r.get('error', 'the standard twin failed')[:60]})")
    lines = _head(res, "Whole-model training throughput") + [
        f"One optimizer step (forward, backward, AdamW), {res.get('precision')}; median of {res.get('rounds')} "
        f"interleaved rounds of {res.get('steps')} steps after a warm-up (its time, compilation included, is "
        f"`warm-up s`). Modes: eager; `torch.compile(fullgraph=True)` (backend {res.get('compile_backend')}); "
        "for the LM also `mode=\"reduce-overhead\"` (CUDA graphs).", "", _verdict(ok, bad, goal), "",
        "| pair | mode | attention | model | batch | params | step ms | samples/s | × standard | warm-up s |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        head = f"| {r['pair']} | {r['mode']} | {r['attention']} | {r['model']} | {r['batch']}"
        if "samples_s" not in r:
            lines.append(head + f" | | {r.get('error', '')[:90]} | | | |")
            continue
        vs = f"{r['vs_standard']:.2f}" if "vs_standard" in r else ("1.00" if r["attention"] == "standard" else "")
        lines.append(head + f" | {r['params']:,} | {r['step_ms']:.1f} | {r['samples_s']:,.1f} | {vs} | "
                            f"{r['warmup_s']:.0f} |")
    return "\n".join(lines)


def render_decode(res: dict | None) -> str:
    goal = "per-token time ≤ 1.05× the standard LM (the DAA Llama: its base), same prefix, batch and mode"
    if not res:
        return "### Decoding on the GPU\n\n" + _verdict([], [], goal)
    rows = res["rows"]
    ok, bad = [], []
    for r in rows:
        if r["model"] in ("standard", "llama") or "prefix" not in r:
            continue
        tag = f"{r['model']}{' graphs' if r['graphs'] else ''} P={r['prefix']} B={r['batch']}"
        if "vs_standard" in r:
            (ok if r["vs_standard"] <= 1.05 else bad).append(f"{tag} {r['vs_standard']:.2f}×")
        else:
            bad.append(f"{tag}: {r.get('error', 'no reference')[:60]}")
    lines = _head(res, "Decoding on the GPU") + [
        f"{res.get('dtype')}, random weights, greedy decoding with the static cache (the LMs: "
        "`new_kv_caches(max_length=...)`; the Llamas: transformers' `StaticCache`), median per-token time over "
        f"{res.get('tokens')} tokens, median of {res.get('rounds')} interleaved rounds. `graphs`: the model under "
        "`torch.compile(mode=\"reduce-overhead\")` (CUDA graphs), compared with the standard LM in the same mode.",
        "", _verdict(ok, bad, goal), "",
        "| prefix | batch | model | graphs | ms/token | × standard |", "|---:|---:|---|---|---:|---:|"]
    for r in rows:
        if "prefix" not in r:
            lines.append(f"| | | {r['model']} | | {r.get('error', '')[:90]} | |")
            continue
        ms = f"{r['ms']:.2f}" if "ms" in r else r.get("error", "")[:90]
        vs = f"{r['vs_standard']:.2f}" if "vs_standard" in r else ""
        lines.append(f"| {r['prefix']} | {r['batch']} | {r['model']} | {'yes' if r['graphs'] else ''} | {ms} | {vs} |")
    return "\n".join(lines)


def render_host(res: dict | None, device: str) -> str:
    goal = "every differential block ≤ 1.3× the standard block's ops on the path a GPU takes (fused kernel)"
    if not res:
        return "### Host cost on the device run\n\n" + _verdict([], [], goal)
    ratios = res.get("fused_block_ratios", {})
    ok = [f"{k} {v:.2f}×" for k, v in ratios.items() if v <= 1.3]
    bad = [f"{k} {v:.2f}×" for k, v in ratios.items() if v > 1.3]
    return "\n".join([
        "### Host cost on the device run", "",
        f"benchmarks/host_ops.py on the device machine's CPU ({res['machine']}, torch {res['torch']}; GPU: "
        f"{device}): aten ops one forward + backward dispatches.", "", _verdict(ok, bad, goal), "", res["table"]])


def render_all(out: Path, command: str) -> dict[str, str]:
    """Every section of docs/benchmarks.md that a run's folder fills, by marker name."""
    steps = _load(out / "steps.json") or []
    ran = ", ".join(f"{s['step']} {s['rc']} in {s['seconds']:.0f} s" for s in steps)
    tests = render(out, command) + (f"\n\nSteps: {ran}." if ran else "")
    return {"gpu-tests": tests, "gpu-core": render_core(_load(out / "core.json")),
            "gpu-models": render_models(_load(out / "models.json")),
            "gpu-decode": render_decode(_load(out / "decode.json")),
            "gpu-host": render_host(_load(out / "host_ops.json"), _device(out))}


def say(out: Path | None, text: str) -> None:
    """Print, and append to the run's own ``log`` (what render reads the device line from)."""
    print(text, flush=True)
    if out is not None:
        with open(out / "log", "a") as f:
            f.write(text + "\n")


#: the default steps, in order, with their time limits (seconds) on an H100 (docstring: the budget)
TIMED = (("core", 130.0), ("models", 170.0), ("decode", 60.0))
#: the steps of the earlier run, still available by name with --steps (they repeat parts of core and models)
LEGACY = ("compiled-warm", "kernel", "train", "kernel-vit", "compiled")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--budget", type=float, default=470.0, help="seconds for the whole run")
    p.add_argument("--workers", type=int, default=12, help="pytest-xdist workers")
    p.add_argument("--phase-a", type=float, default=100.0, help="seconds for the side-by-side steps (pytest, host)")
    p.add_argument("--steps", nargs="*", default=["pytest", "host", *(n for n, _ in TIMED)],
                   help=f"steps to run (default: pytest host core models decode; also: {' '.join(LEGACY)})")
    p.add_argument("--skip", nargs="*", default=[], help="steps to leave out")
    p.add_argument("--dry-run", action="store_true",
                   help="every step on this machine (the CPU) at tiny shapes, 1–2 iterations, the same files: a "
                        "broken step shows before device time is spent")
    p.add_argument("--kernel-args", default="", help="extra arguments for benchmarks/kernel.py")
    p.add_argument("--no-tune", dest="tune", action="store_false",
                   help="time the kernel with the library's tile table instead of sweeping tiles first")
    p.add_argument("--render", type=Path, help="do not run: render this run's folder (with --markdown)")
    p.add_argument("--markdown", type=Path, help="write the rendered sections into this file")
    p.add_argument("--command", default="", help="the device command to print beside the rendered tables")
    args = p.parse_args(argv)
    if args.render:
        sections = render_all(args.render, args.command)
        if args.markdown:
            sys.path.insert(0, str(ROOT / "src"))
            from diffattn.utils import write_markdown_section

            for key, text in sections.items():
                write_markdown_section(args.markdown, key, text)
        print("\n\n".join(sections.values()))
        return 0
    t_start = time.perf_counter()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "log").write_text("")

    import torch

    dry = args.dry_run
    if not torch.cuda.is_available() and not dry:
        say(out, "gpu_check: no CUDA device here; every step needs one (run --dry-run to check the steps).")
        return 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
               DIFFATTN_GPU_REPORT=str(out / "gpu_report.jsonl"))
    py = sys.executable
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (dry run)"
    say(out, f"device: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, {os.cpu_count()} CPUs"
             + (", dry run" if dry else ""))
    steps = [s for s in args.steps if s not in args.skip]
    # a dry run checks that every step works, not its time: twice the device limits, since on 2 CPU cores that
    # other jobs share decode alone took 30 s quiet and over 60 s at a load average of 6
    scale = 2.0 if dry else 1.0

    def left() -> float:
        return args.budget - (time.perf_counter() - t_start)

    results = []
    logs = out / "steps"
    logs.mkdir(exist_ok=True)
    dry_flag = ["--dry-run"] if dry else []

    # ---- phase A, side by side: the correctness tests (GPU) and the host-cost count (CPU only)
    running = []
    if "pytest" in steps:
        import importlib.util

        xdist = ["-n", str(args.workers)] if importlib.util.find_spec("xdist") and args.workers > 1 and not dry else []
        running.append(Step("pytest", [py, "-m", "pytest", "tests/test_kernels.py", "tests/test_train_gpu.py", "-m",
                                       "gpu or not gpu", "-q", "-rfE", "-p", "no:cacheprovider", *xdist,
                                       *(["--collect-only"] if dry else ["--durations=15"])],
                            out / "pytest.log", env, min(args.phase_a * (2 if dry else 1), left())))
    if "host" in steps:
        running.append(Step("host", [py, "benchmarks/host_ops.py", "--json", str(out / "host_ops.json"),
                                     *(["--no-models"] if dry else [])],
                            logs / "host.log", env, min(args.phase_a * (2 if dry else 1), left())))
    if "compiled-warm" in steps:
        running.append(Step("compiled-warm", [py, "benchmarks/compiled.py", "--steps", "1", "--warmup", "0"],
                            logs / "compiled_warm.log", env, min(args.phase_a, left())))
    results += [s.wait() for s in running]

    # ---- timing, one step at a time, so that nothing else runs on the GPU
    plan = [(n, [py, "benchmarks/gpu_goals.py", n, *dry_flag, "--out", str(out / f"{n}.json"),
                 *(["--dispatch-out", str(out / "dispatch.json")] if n == "core" else [])], limit * scale)
            for n, limit in TIMED]
    plan += [
        ("kernel", [py, "benchmarks/kernel.py", *(["--tune"] if args.tune else []), "--out",
                    str(out / "kernel.json"), *args.kernel_args.split()], 130.0),
        ("train", [py, "benchmarks/train.py", "--device", "cuda", "--families", "vit_b16", "clip_b16", "--batch",
                   "64", "--rounds", "3", "--steps", "3", "--profile", "--json", str(out / "train.json")], 80.0),
        # the attention core alone at ViT-B/16's shape (B 64, N 197, D 768): what the training step spends in it
        ("kernel-vit", [py, "benchmarks/kernel.py", "--tokens", "12608", "--seqlens", "197", "--dim", "768",
                        "--head-dims", "64", "--causal", "0", "--out", str(out / "kernel_vit.json")], 40.0),
        ("compiled", [py, "benchmarks/compiled.py", "--json", str(out / "compiled.json")], 70.0),
    ]
    for step_name, cmd, limit in plan:
        if step_name not in steps:
            continue
        limit = min(limit, left())
        if limit < 10:
            results.append(dict(step=step_name, rc="not run: out of time", seconds=0))
            say(out, f"skip {step_name}: {left():.0f} s left")
            continue
        results.append(Step(step_name, cmd, logs / f"{step_name}.log", env, limit).wait())

    # ---- one file of the steps' output (the files that come back are few)
    with open(out / "steps.log", "w") as f:
        for log in sorted(logs.glob("*.log")):
            f.write(f"\n===== {log.stem} =====\n{log.read_text(errors='replace')}")
    for log in logs.glob("*.log"):
        log.unlink()
    logs.rmdir()
    (out / "steps.json").write_text(json.dumps(results, indent=1))

    say(out, "\n===== summary =====\n" + json.dumps(results))
    say(out, "\n--- pytest (tail)\n" + tail(out / "pytest.log", 25))
    try:
        sections = render_all(out, "")
        say(out, "\n\n".join(sections.values()))
    except Exception as e:  # noqa: BLE001 - the files are what matters; the render can be redone from them
        say(out, f"render failed: {type(e).__name__}: {e}")
    say(out, f"\ntotal {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
