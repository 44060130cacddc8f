"""The operator's package (``diffattn.ops``) and its public surface: the rest of the library imports only the names of
its ``__all__`` (an AST scan of src/), no public function takes a private keyword, the packed-heads variant gives
the numbers of the plain operator bit for bit, and the old module paths keep working."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import warnings
from importlib import resources
from pathlib import Path

import pytest
import torch

import diffattn.functional
import diffattn.ops as ops
import diffattn.ops.functional as ops_functional
import diffattn.unpadded
from diffattn.deprecations import DEPRECATIONS

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "diffattn"
OPS = SRC / "ops"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(path: Path, node: ast.ImportFrom, src: Path) -> str:
    """The absolute module name of a ``from ... import`` in ``path`` (a file under ``src``, the package folder)."""
    if not node.level:
        return node.module or ""
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = [p for p in package if p != "__init__"]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_ops_uses(path: Path, src: Path = SRC) -> list[str]:
    """Each private name of ``diffattn.ops`` that ``path`` takes: ``from ..ops.x import _name``, ``from ..ops import
    _x`` and ``x._name`` on a name bound to an ops module (``from ..ops import functional``, ``import
    diffattn.ops.functional as f``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = _absolute(path, node, src)
            if mod != "diffattn.ops" and not mod.startswith("diffattn.ops."):
                continue
            for a in node.names:
                if _private(a.name):
                    found.append(f"{path.name}:{node.lineno} from {mod} import {a.name}")
                else:
                    modules.add(a.asname or a.name)  # a module or a public name: attributes of either are checked
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "diffattn.ops" or a.name.startswith("diffattn.ops."):
                    if any(_private(p) for p in a.name.split(".")):
                        found.append(f"{path.name}:{node.lineno} import {a.name}")
                    if a.asname:
                        modules.add(a.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            value = node.value
            if isinstance(value, ast.Name) and value.id in modules:
                found.append(f"{path.name}:{node.lineno} {value.id}.{node.attr}")
            elif ast.unparse(value).startswith("diffattn.ops"):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_outside_ops_takes_a_private_name_of_ops():
    outside = [p for p in sorted(SRC.rglob("*.py")) if OPS not in p.parents]
    found = [use for p in outside for use in private_ops_uses(p)]
    assert not found, "private names of diffattn.ops used outside it (give them a public name in ops.__all__):\n" + \
        "\n".join(found)


def test_the_scan_sees_each_way_of_taking_a_private_name(tmp_path):
    src = tmp_path / "diffattn"
    (src / "layers").mkdir(parents=True)
    bad = src / "layers" / "bad.py"
    bad.write_text("from ..ops.functional import _upcast, diff_attention\nfrom ..ops import functional, _x\n"
                   "import diffattn.ops.blockwise as bw\n\n"
                   "def f():\n    return functional._triton_reason, bw._rows, diffattn.ops.functional._probs\n")
    good = src / "layers" / "good.py"
    good.write_text("from ..ops import diff_attention, functional\nfrom ..other import _private\n\n"
                    "def f():\n    return functional.diff_attention, diff_attention.__doc__\n")
    found = private_ops_uses(bad, src)
    assert [u.split(" ", 1)[1] for u in found] == [
        "from diffattn.ops.functional import _upcast", "from diffattn.ops import _x", "functional._triton_reason",
        "bw._rows", "diffattn.ops.functional._probs"]
    assert private_ops_uses(good, src) == []


def test_the_public_surface_is_defined_and_takes_no_private_keyword():
    assert len(set(ops.__all__)) == len(ops.__all__)
    for name in ops.__all__:
        obj = getattr(ops, name)
        assert obj is getattr(ops_functional, name), name
        if inspect.isfunction(obj):
            assert obj.__doc__, name
            assert not [p for p in inspect.signature(obj).parameters if p.startswith("_")], name
    assert set(ops.__all__) <= set(ops_functional.__all__)


def test_the_old_module_paths_are_the_same_objects_without_a_warning():
    code = "import diffattn.functional, diffattn.unpadded, diffattn.kernels"  # importing warns about nothing
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert set(diffattn.functional.__all__) == set(ops_functional.__all__)
    for name in diffattn.functional.__all__:
        assert getattr(diffattn.functional, name) is getattr(ops_functional, name), name
    assert diffattn.diff_attention is ops.diff_attention is diffattn.functional.diff_attention
    assert diffattn.unpadded.flex_diff_attention is importlib.import_module("diffattn.ops.unpadded").flex_diff_attention


@pytest.mark.parametrize("name", ["triton_diff_attention", "triton_unsupported_reason", "triton_diff"])
def test_the_kernels_old_names_warn_and_resolve_to_ops_kernels(name):
    pytest.importorskip("triton")
    import diffattn.kernels as old

    new = importlib.import_module("diffattn.ops.kernels")
    row = DEPRECATIONS[f"diffattn.kernels.{name}"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = getattr(old, name)
    assert [w.category for w in record] == [FutureWarning] and record[0].filename == __file__
    assert str(record[0].message).startswith(f"diffattn.kernels.{name} is deprecated since diffattn {row.since}")
    assert row.replacement in str(record[0].message)
    assert got is (importlib.import_module("diffattn.ops.kernels.triton_diff") if name == "triton_diff"
                   else getattr(new, name))
    with pytest.raises(AttributeError, match="module 'diffattn.kernels' has no attribute 'nope'"):
        old.nope  # noqa: B018


def test_the_dispatch_table_ships_with_the_ops_package():
    assert resources.files("diffattn.ops").joinpath("dispatch.json").is_file()
    assert '"diffattn.ops" = ["dispatch.json"]' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert importlib.import_module("diffattn.ops.dispatch").load_table()


# ------------------------------------------------------------------------------------ the packed-heads operator

def _pairs(k_paired: bool, dtype=torch.float64, *, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    B, H, N, d = 2, 3, 7, 8
    q = torch.randn(B, N, 2 * H, d, generator=g, dtype=dtype).transpose(1, 2)  # the layers' (B, N, heads, d) views
    k = torch.randn(B, N, (2 * H if k_paired else H), d, generator=g, dtype=dtype).transpose(1, 2)
    v = torch.randn(B, H, N, 2 * d if k_paired else d, generator=g, dtype=dtype)
    lam = torch.rand(B, H, N, 1, generator=g, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (q, k, v, lam)]


@pytest.mark.parametrize("k_paired", [True, False])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_diff_attention_pairs_is_diff_attention_on_the_split_heads_bit_for_bit(k_paired, backend, dtype):
    q, k, v, lam = _pairs(k_paired, dtype)
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool).tril()
    kw = dict(attn_mask=mask, backend=backend, scale=0.3)
    k1, k2 = (k[:, 0::2], k[:, 1::2]) if k_paired else (k, k)
    got = ops.diff_attention_pairs(q, k, v, lam, k_paired=k_paired, **kw)
    want = ops.diff_attention(q[:, 0::2], k1, q[:, 1::2], k2, v, lam, **kw)
    assert got.shape == (2, 3, 7, v.shape[-1]) and torch.equal(got, want)


def test_diff_attention_pairs_gradients_match_the_split_call():
    grads = []
    for packed in (True, False):
        q, k, v, lam = _pairs(True, requires_grad=True)
        if packed:
            out = ops.diff_attention_pairs(q, k, v, lam, backend="sdpa")
        else:
            out = ops.diff_attention(q[:, 0::2], k[:, 0::2], q[:, 1::2], k[:, 1::2], v, lam, backend="sdpa")
        out.square().sum().backward()
        grads.append([t.grad for t in (q, k, v, lam)])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_diff_attention_pairs_names_bad_input():
    q, k, v, lam = _pairs(True)
    with pytest.raises(ValueError, match="k_paired must be a bool, got int"):
        ops.diff_attention_pairs(q, k, v, lam, k_paired=1)
    with pytest.raises(ValueError, match=r"q must hold head pairs .* got shape \(2, 5, 7, 8\)"):
        ops.diff_attention_pairs(q[:, :5], k, v, lam)
    with pytest.raises(ValueError, match=r"k must be a 4-D tensor \(B, heads, N, d\), got \(6, 7, 8\)"):
        ops.diff_attention_pairs(q, k[0], v, lam)
    with pytest.raises(ValueError, match="return_weights=True needs backend 'math' or 'auto'"):
        ops.diff_attention_pairs(q, k, v, lam, backend="sdpa", return_weights=True)
