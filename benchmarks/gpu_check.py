"""Every GPU check of the project in one run, each step with its own time limit, continuing past failures.

Phase A (correctness, steps side by side: they compile more than they compute):
    pytest     tests/test_kernels.py and tests/test_train_gpu.py with ``-m "gpu or not gpu"`` (the half-precision
               kernel cases against the float64 reference and the ``sdpa`` backend, N = 1 … 16384, d = 64 and 128;
               one bf16 training step per model family against float32 on the CPU; the compiled layer)
    compiled-warm  benchmarks/compiled.py once, so that inductor's caches are warm for the timed run
Phase B (timing, one step at a time, so that nothing else runs on the GPU):
    kernel     benchmarks/kernel.py --tune: tile sweep, then the table of the fused kernel against SDPA
    train      benchmarks/train.py: ViT-B/16, DiffViT-B/16, DGViT-B/16, CLIP-B/16, DiffCLIP-B/16, DGCLIP-B/16
    compiled   benchmarks/compiled.py: eager against torch.compile(fullgraph=True)

Writes to ``--out`` (at most 7 files): pytest.log, steps.log (the other steps' output), gpu_report.jsonl (the
tests' measured errors), kernel.json, train.json, compiled.json; the driver's own output is meant to be tee'd to
``log``. Without CUDA it says so and exits 0 (the steps would only skip).

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget", type=float, default=400.0, help="seconds for the whole run")
    p.add_argument("--workers", type=int, default=12, help="pytest-xdist workers")
    p.add_argument("--phase-a", type=float, default=160.0, help="seconds for the correctness steps")
    p.add_argument("--skip", nargs="*", default=[], help="steps to leave out")
    p.add_argument("--kernel-args", default="", help="extra arguments for benchmarks/kernel.py")
    args = p.parse_args(argv)
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
        ("kernel", [py, "benchmarks/kernel.py", "--tune", "--out", str(out / "kernel.json"),
                    *args.kernel_args.split()], 130.0),
        ("train", [py, "benchmarks/train.py", "--device", "cuda", "--families", "vit_b16", "clip_b16", "--batch",
                   "64", "--rounds", "3", "--steps", "3", "--json", str(out / "train.json")], 70.0),
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
    for name in ("kernel", "train", "compiled"):
        print(f"\n--- {name} (tail)")
        text = (out / "steps.log").read_text(errors="replace")
        part = text.split(f"===== {name} =====")[-1] if f"===== {name} =====" in text else ""
        print("\n".join(part.splitlines()[-45 if name == "kernel" else -15:]))
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
