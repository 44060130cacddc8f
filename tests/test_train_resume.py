"""Exact resume: a run killed with SIGKILL after its first checkpoint and restarted with ``--resume auto`` logs
bit-identical per-step losses (CPU, fp32) and ends with bit-identical weights; and the resume arithmetic of
:mod:`diffattn.train.resume` (which checkpoint may continue a config, its planned budget, the extended schedule)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from diffattn.errors import UsageError
from diffattn.train.config import TrainConfig, config_digest, load_config
from diffattn.train.distributed import DistEnv
from diffattn.train.optim import build_scheduler
from diffattn.train.resume import check_resume, extend_schedule, flat

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


# ----------------------------------------------------------------------------------------- resume arithmetic


def _cfg(*sets: str) -> TrainConfig:
    return load_config("tiny/classify", ["run.progress=false", *sets])


def _ckpt(cfg: TrainConfig, step: int, world_size: int = 1) -> dict:
    return {"step": step, "world_size": world_size, "config": config_digest(cfg)}


def test_check_resume_returns_the_budget_the_checkpoint_was_planned_for():
    old = _cfg("run.steps=10")
    assert check_resume(_ckpt(old, 4), _cfg("run.steps=10"), DistEnv(), Path("c"), 100, 10) == 10
    assert check_resume(_ckpt(old, 4), _cfg("run.steps=30"), DistEnv(), Path("c"), 100, 30) == 10  # extended
    # by epochs: ceil(2 · (100 // 32)) = 6 steps, whatever the new budget
    by_epochs = _cfg("run.steps=null", "run.epochs=2", "run.batch_size=32")
    assert check_resume(_ckpt(by_epochs, 3), _cfg("run.steps=8", "run.batch_size=32"), DistEnv(), Path("c"), 100,
                        8) == 6


def test_check_resume_refuses_another_world_size_config_or_a_smaller_budget():
    old = _cfg("run.steps=10")
    with pytest.raises(UsageError, match=r"checkpoint c was written by 2 processes, this run has 1"):
        check_resume(_ckpt(old, 4, world_size=2), old, DistEnv(), Path("c"), 100, 10)
    with pytest.raises(UsageError, match=r"another config: optim.lr 0.003 → 0.01; run.seed 0 → 1; only the step "
                                         r"budget"):
        check_resume(_ckpt(old, 4), _cfg("run.steps=10", "optim.lr=1e-2", "run.seed=1"), DistEnv(), Path("c"), 100,
                     10)
    # the logging keys may change (RESUMABLE_KEYS)
    assert check_resume(_ckpt(old, 4), _cfg("run.steps=10", "run.log_every=1"), DistEnv(), Path("c"), 100, 10) == 10
    with pytest.raises(UsageError, match=r"the step budget is 3 steps, but checkpoint c is at step 4; .* give "
                                         r"run.steps >= 4"):
        check_resume(_ckpt(old, 4), _cfg("run.steps=3"), DistEnv(), Path("c"), 100, 3)


def test_extend_schedule_gives_the_lr_of_a_run_planned_for_the_new_total():
    cfg = _cfg("run.steps=20", "optim.warmup_steps=2", "optim.min_lr_ratio=0.1")
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    sched = build_scheduler(opt, cfg.optim, 20)  # the resumed run's scheduler: its closure holds the new total
    for _ in range(5):
        opt.step()
        sched.step()
    opt.param_groups[0]["lr"] = 0.123  # what the checkpoint of a 10-step run left
    extend_schedule(opt, sched, 5, 20, cfg)
    # step 5 of 20 after 2 warm-up steps: 0.1 + 0.9 · ½(1 + cos(π · 3/18))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 6)))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.93971143, abs=1e-8)
    assert sched.get_last_lr() == [opt.param_groups[0]["lr"]]
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 18)))


def test_flat_joins_the_keys_of_nested_sections():
    assert flat({"run": {"steps": 3, "out": "r"}, "model": {"overrides": {}, "name": "vit"}, "x": 1}) == {
        "run.steps": 3, "run.out": "r", "model.overrides": {}, "model.name": "vit", "x": 1}
