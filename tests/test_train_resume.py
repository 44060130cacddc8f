"""Exact resume: a run killed with SIGKILL after its first checkpoint and restarted with ``--resume auto`` logs
bit-identical per-step losses (CPU, fp32) and ends with bit-identical weights."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--set", "run.steps=24", "--set", "run.ckpt_every=4", "--set", "run.log_every=1", "--set",
        "run.progress=false", "--set", "model.overrides.depth=1", "--set", "run.batch_size=16",
        "--set", "task.mixup=0.4", "--set", "task.cutmix=0.4", "--set", "run.ema_decay=0.9"]


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "diffattn", "train", "tiny/classify", "--out", str(out),
            *ARGS, *extra]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


@pytest.mark.slow
def test_sigkill_then_resume_auto_is_bit_exact(tmp_path):
    ref = tmp_path / "ref"
    subprocess.run(_cmd(ref), env=_env(), check=True, capture_output=True, timeout=300)

    run = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(run), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = run / "checkpoints" / "step_00000004" / "state.pt"
    deadline = time.monotonic() + 300
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (run / "model").exists()
    done_before = len(_losses(run))
    assert 4 <= done_before < 24

    res = subprocess.run(_cmd(run, "--resume", "auto"), env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _losses(run) == _losses(ref)  # exact float equality, every step
    assert [s for s, _ in _losses(run)] == list(range(1, 25))
    from safetensors.torch import load_file

    for sub in ("model", "ema/model"):
        a, b = load_file(ref / sub / "model.safetensors"), load_file(run / sub / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sub
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step_00000016", "step_00000020", "step_00000024"]  # keep_last 3

    # a checkpoint of another config is refused with the differing key named, old → new
    res = subprocess.run(_cmd(run, "--resume", "auto", "--set", "optim.lr=1e-2"), env=_env(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode != 0 and "optim.lr 0.003 → 0.01" in res.stderr
