"""The measured dispatch table behind backend="auto"'s choice between the fused kernel and sdpa on a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from diffattn.ops import dispatch
from diffattn.ops.functional import _triton_preferred


def test_packaged_table_holds_the_h200_measurements():
    entries = dispatch.load_table()
    h200 = {e.value_width: e for e in entries if e.device == "NVIDIA H200"}
    assert h200[128].triton_below_keys is None and h200[256].triton_below_keys == 2048
    assert all(e.default for e in h200.values()) and all(e.measured for e in entries)


def test_rule_per_width_and_length():
    """A card the table does not name (here the CPU's name) gets the default entries; an unmeasured width up to
    128 takes the kernel, a wider one does not."""
    q = torch.zeros(1)
    assert _triton_preferred(q.bfloat16(), 128, 16384) is not None
    assert _triton_preferred(q.bfloat16(), 256, 2047) is not None
    assert _triton_preferred(q.bfloat16(), 256, 2048) is None
    assert _triton_preferred(q, 64, 10**6).device == "any"
    assert _triton_preferred(q, 512, 16) is None


def _rows(width, times):
    """core rows: {(n, causal): (triton ms, sdpa ms)}"""
    rows = []
    for (n, causal), (t, s) in times.items():
        rows += [dict(method="diff_triton", head_dim=width, seqlen=n, causal=causal, fwd_bwd_ms=t),
                 dict(method="diff_sdpa", head_dim=width, seqlen=n, causal=causal, fwd_bwd_ms=s)]
    return rows


def test_entries_from_measurements():
    rows = _rows(64, {(1024, False): (1.0, 2.0), (4096, False): (3.0, 4.0), (4096, True): (2.0, 3.0)})
    rows += _rows(128, {(1024, False): (1.0, 1.1), (2048, True): (2.1, 2.0), (4096, False): (5.0, 4.0)})
    rows += [dict(method="std_flash", head_dim=64, seqlen=1024, causal=False, fwd_bwd_ms=0.1)]
    rows += _rows(32, {(1024, False): (1.0, 2.0)}) + [dict(method="diff_sdpa", head_dim=32, seqlen=2048,
                                                             causal=False, error="out of memory")]
    got = dispatch.entries_from_core_rows(rows, "NVIDIA H100", "bfloat16", "gpu_goals core, test")
    assert [(e["value_width"], e["triton_below_keys"]) for e in got] == [(128, None), (256, 2048)]


def test_merge_and_load(tmp_path):
    new = [dict(device="NVIDIA H200", dtype="bfloat16", value_width=256, triton_below_keys=8192, measured="x"),
           dict(device="NVIDIA H100 80GB HBM3", dtype="bfloat16", value_width=256, triton_below_keys=4096,
                measured="y")]
    data = dispatch.merge_entries(None, new)
    path = tmp_path / "dispatch.json"
    path.write_text(json.dumps(data))
    entries = {(e.device, e.value_width): e for e in dispatch.load_table(path)}
    assert entries["NVIDIA H200", 256].triton_below_keys == 8192 and entries["NVIDIA H200", 256].default
    assert entries["NVIDIA H100 80GB HBM3", 256].triton_below_keys == 4096
    assert not entries["NVIDIA H100 80GB HBM3", 256].default and entries["NVIDIA H200", 128].default
    path.write_text(json.dumps({"format": 1, "entries": [{"device": "x", "dtype": "bf16", "value_width": 64,
                                                          "triton_below_keys": 0}]}))
    with pytest.raises(ValueError, match=r"entry 0: triton_below_keys must be null or an integer >= 1, got 0"):
        dispatch.load_table(path)
    path.write_text(json.dumps({"format": 2, "entries": []}))
    with pytest.raises(ValueError, match="format must be 1, got 2"):
        dispatch.load_table(path)
