"""benchmarks/gpu_check.py's dry run on the CPU: every step runs end to end at tiny shapes, writes its files, and
the render gives each goal a met / not met / not measured line, so that a broken step is found before device time
is spent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "run"
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = json.loads((out / "steps.json").read_text())
    assert {s["step"]: s["rc"] for s in steps} == dict(pytest=0, host=0, core=0, models=0, decode=0)
    for name in ("core", "models", "decode", "host_ops"):
        result = json.loads((out / f"{name}.json").read_text())
        assert result.get("rows") or result.get("table"), name
    core = json.loads((out / "core.json").read_text())["rows"]
    assert {r["method"] for r in core} >= {"std_flash", "std_cudnn", "std_efficient", "diff_sdpa", "diff_triton",
                                           "diff_split4", "naive"}
    assert any("fwd_bwd_ms" in r for r in core if r["method"] == "diff_split4")
    models = json.loads((out / "models.json").read_text())["rows"]
    assert {(r["pair"], r["mode"]) for r in models if "samples_s" in r} >= {
        ("vit_b16", "eager"), ("clip_b16", "compiled"), ("lm_125m", "reduce-overhead")}
    decode = json.loads((out / "decode.json").read_text())["rows"]
    assert {r["model"] for r in decode if "ms" in r} >= {"standard", "diff", "diff_v2", "gated", "llama",
                                                         "llama+daa"}
    assert "collected" in (out / "pytest.log").read_text()

    md = tmp_path / "bench.md"
    r = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--render", str(out), "--markdown", str(md)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    text = md.read_text()
    for key in ("gpu-tests", "gpu-core", "gpu-models", "gpu-decode", "gpu-host"):
        assert f"<!-- {key}:begin -->" in text
        if key != "gpu-tests":
            body = text.split(f"<!-- {key}:begin -->")[1].split(f"<!-- {key}:end -->")[0]
            assert any(f"**{v}**" in body for v in ("met", "not met", "not measured")), key


def test_render_empty_folder_says_not_measured(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    sections = gpu_check.render_all(tmp_path, "")
    for key in ("gpu-core", "gpu-models", "gpu-decode", "gpu-host"):
        assert "**not measured**" in sections[key]
