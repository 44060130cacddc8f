"""diffattn.utils: the results-section writer and the CPU peak-memory probe."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from diffattn.utils import MALLOC_ENV, cpu_name, peak_memory_mb, write_markdown_section


def test_write_markdown_section_replaces_only_its_section(tmp_path):
    doc = tmp_path / "b.md"
    write_markdown_section(doc, "x", "first\n")
    assert doc.read_text() == "<!-- x:begin -->\nfirst\n<!-- x:end -->\n"
    doc.write_text("# Title\n\nintro\n\n" + doc.read_text() + "\noutro\n")
    write_markdown_section(doc, "x", "second")
    write_markdown_section(doc, "y", "other")
    text = doc.read_text()
    assert "first" not in text and "<!-- x:begin -->\nsecond\n<!-- x:end -->" in text
    assert text.startswith("# Title\n\nintro\n\n") and "outro" in text
    assert text.rstrip().endswith("<!-- y:begin -->\nother\n<!-- y:end -->")


def test_peak_memory_sees_a_large_allocation():
    """Exact only in a fresh process started with MALLOC_ENV (the way the benchmark and memory test use it)."""
    if peak_memory_mb(lambda: None) is None:
        pytest.skip("peak RSS needs Linux /proc/self/clear_refs")
    code = ("import torch; from diffattn.utils import peak_memory_mb; "
            "print(peak_memory_mb(lambda: torch.ones(64 * 2**20 // 4).add_(1)))")  # 64 MiB
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, **MALLOC_ENV}, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert 60 < float(res.stdout.strip().splitlines()[-1]) < 200
    assert isinstance(cpu_name(), str) and cpu_name()
