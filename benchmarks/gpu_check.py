"""Every GPU check of the project in one run, each step with its own time limit, continuing past failures.

Phase A (correctness, steps side by side: they compile more than they compute):
    pytest     tests/test_kernels.py and tests/test_train_gpu.py with ``-m "gpu or not gpu"`` (the half-precision
               kernel cases against the float64 reference and the ``sdpa`` backend, N = 1 … 16384, d = 64 and 128;
               one bf16 training step per model family against float32 on the CPU; the compiled layer)
    compiled-warm  benchmarks/compiled.py once, so that inductor's caches are warm for the timed run
Phase B (timing, one step at a time, so that nothing else runs on the GPU):
    kernel     benchmarks/kernel.py --tune: tile sweep, then the table of the fused kernel against SDPA
    train      benchmarks/train.py: ViT-B/16, DiffViT-B/16, DGViT-B/16, CLIP-B/16, DiffCLIP-B/16, DGCLIP-B/16
    kernel-vit benchmarks/kernel.py at ViT-B/16's attention shape (N = 197)
    compiled   benchmarks/compiled.py: eager against torch.compile(fullgraph=True)

Writes to ``--out`` (at most 8 files): pytest.log, steps.log (the other steps' output), gpu_report.jsonl (the
tests' measured errors), kernel.json, kernel_vit.json, train.json, compiled.json; the driver's own output is meant
to be tee'd to ``log``. Without CUDA it says so and exits 0 (the steps would only skip).

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out "$OUT" --budget 400 2>&1 | tee "$OUT/log"
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
    log = (out / "pytest.log").read_text(errors="replace").splitlines()
    summary = next((ln.strip("= ") for ln in reversed(log) if " passed" in ln or " failed" in ln), "no summary")
    device = next((ln.split("device: ", 1)[1].split(",")[0] for ln in (out / "log").read_text().splitlines()
                   if ln.startswith("device: ")), "?")
    failed = [ln for ln in log if ln.startswith("FAILED") or ln.startswith("ERROR")]
    records = [json.loads(ln) for ln in (out / "gpu_report.jsonl").read_text().splitlines() if ln.strip()]
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--budget", type=float, default=400.0, help="seconds for the whole run")
    p.add_argument("--workers", type=int, default=12, help="pytest-xdist workers")
    p.add_argument("--phase-a", type=float, default=160.0, help="seconds for the correctness steps")
    p.add_argument("--skip", nargs="*", default=[], help="steps to leave out")
    p.add_argument("--kernel-args", default="", help="extra arguments for benchmarks/kernel.py")
    p.add_argument("--no-tune", dest="tune", action="store_false",
                   help="time the kernel with the library's tile table instead of sweeping tiles first")
    p.add_argument("--render", type=Path, help="do not run: render this run's folder (with --markdown)")
    p.add_argument("--markdown", type=Path, help="write the rendered tests section into this file")
    p.add_argument("--command", default="", help="the device command to print beside the rendered tables")
    args = p.parse_args(argv)
    if args.render:
        text = render(args.render, args.command)
        if args.markdown:
            sys.path.insert(0, str(ROOT / "src"))
            from diffattn.utils import write_markdown_section

            write_markdown_section(args.markdown, "gpu-tests", text)
        print(text)
        return 0
    t_start = time.perf_counter()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; every step needs one (the tests would only skip).")
        return 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
               DIFFATTN_GPU_REPORT=str(out / "gpu_report.jsonl"))
    py = sys.executable
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{os.cpu_count()} CPUs", flush=True)

    def left() -> float:
        return args.budget - (time.perf_counter() - t_start)

    results = []
    logs = out / "steps"
    logs.mkdir(exist_ok=True)

    # ---- phase A: correctness, side by side
    running = []
    if "pytest" not in args.skip:
        import importlib.util

        xdist = ["-n", str(args.workers)] if importlib.util.find_spec("xdist") and args.workers > 1 else []
        running.append(Step("pytest", [py, "-m", "pytest", "tests/test_kernels.py", "tests/test_train_gpu.py", "-m",
                                       "gpu or not gpu", "-q", "-rfE", "-p", "no:cacheprovider", *xdist,
                                       "--durations=15"],
                            out / "pytest.log", env, min(args.phase_a, left())))
    if "compiled" not in args.skip:
        running.append(Step("compiled-warm", [py, "benchmarks/compiled.py", "--steps", "1", "--warmup", "0"],
                            logs / "compiled_warm.log", env, min(args.phase_a, left())))
    results += [s.wait() for s in running]

    # ---- phase B: timing, one at a time
    plan = [
        ("kernel", [py, "benchmarks/kernel.py", *(["--tune"] if args.tune else []), "--out",
                    str(out / "kernel.json"), *args.kernel_args.split()], 130.0),
        ("train", [py, "benchmarks/train.py", "--device", "cuda", "--families", "vit_b16", "clip_b16", "--batch",
                   "64", "--rounds", "3", "--steps", "3", "--profile", "--json", str(out / "train.json")], 80.0),
        # the attention core alone at ViT-B/16's shape (B 64, N 197, D 768): what the training step spends in it
        ("kernel-vit", [py, "benchmarks/kernel.py", "--tokens", "12608", "--seqlens", "197", "--dim", "768",
                        "--head-dims", "64", "--causal", "0", "--out", str(out / "kernel_vit.json")], 40.0),
        ("compiled", [py, "benchmarks/compiled.py", "--json", str(out / "compiled.json")], 70.0),
    ]
    for name, cmd, limit in plan:
        if name in args.skip:
            continue
        limit = min(limit, left())
        if limit < 20:
            results.append(dict(step=name, rc="not run: out of time", seconds=0))
            print(f"skip {name}: {left():.0f} s left", flush=True)
            continue
        results.append(Step(name, cmd, logs / f"{name}.log", env, limit).wait())

    # ---- one file of the steps' output (the files that come back are few)
    with open(out / "steps.log", "w") as f:
        for log in sorted(logs.glob("*.log")):
            f.write(f"\n===== {log.stem} =====\n{log.read_text(errors='replace')}")
    for log in logs.glob("*.log"):
        log.unlink()
    logs.rmdir()

    print("\n===== summary =====")
    print(json.dumps(results))
    print("\n--- pytest (tail)\n" + tail(out / "pytest.log", 40))
    text = (out / "steps.log").read_text(errors="replace")
    for name, keep in (("kernel", lambda ln: ln.startswith("- ") or ln.startswith("# tune")),
                       ("train", lambda ln: ln.startswith("| ") or ln.startswith("### profile")),
                       ("kernel-vit", lambda ln: ln.startswith("| 64")),
                       ("compiled", lambda ln: ln.startswith("| "))):
        part = text.split(f"===== {name} =====")[-1].split("\n===== ")[0] if f"===== {name} =====" in text else ""
        print(f"\n--- {name}\n" + "\n".join(ln for ln in part.splitlines() if keep(ln)))
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
