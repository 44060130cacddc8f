"""Every ```python block of docs/integrations.md runs, in order, in one namespace, in a temporary folder, offline.

A block opened with ```python no-run is shown to the reader and skipped here. The harness knows nothing about
the page's sections, so sections appended later run the same way."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "integrations.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every block whose info string is exactly ``python``."""
    out = []
    for m in FENCE.finditer(text):
        if m.group(1).strip() == "python":
            out.append((text[:m.start()].count("\n") + 2, m.group(2)))
    return out


def test_harness_selects_python_blocks_only():
    text = "```python\na = 1\n```\n```python no-run\nb = 2\n```\n```bash\nls\n```\n```python\nc = 3\n```\n"
    assert [code for _, code in blocks(text)] == ["a = 1\n", "c = 3\n"]


@pytest.mark.slow
def test_every_python_block_runs(tmp_path, monkeypatch, one_thread):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("accelerate")
    found = blocks(DOC.read_text(encoding="utf-8"))
    assert found, f"{DOC} has no ```python block"
    monkeypatch.chdir(tmp_path)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("WANDB_DISABLED", "true")
    namespace: dict = {"__name__": "__docs__"}
    for line, code in found:
        try:
            exec(compile(code, f"{DOC.name}:{line}", "exec"), namespace)
        except Exception as e:  # name the block that failed
            raise AssertionError(f"{DOC.name} block at line {line} failed: {type(e).__name__}: {e}") from e
    assert os.listdir(tmp_path)  # the blocks wrote their checkpoints here, not into the repository
