"""The API reference (docs/api, built by `make docs` with mkdocs + mkdocstrings): every public name of diffattn has
a docstring and a place in the reference source, and the reference builds without warnings when mkdocs is there."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import diffattn

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.M)


def _canonical(name: str) -> str:
    """Where the object of ``diffattn.<name>`` is defined (what a mkdocstrings directive names)."""
    obj = getattr(diffattn, name)
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    return f"{obj.__module__}.{obj.__qualname__}"


def _directives() -> set[str]:
    return {m for page in API.glob("*.md") for m in DIRECTIVE.findall(page.read_text(encoding="utf-8"))}


def test_every_public_name_has_a_docstring():
    missing = []
    for name in diffattn.__all__:
        obj = getattr(diffattn, name)
        if name == "__version__":
            assert re.fullmatch(r"\d+\.\d+\.\d+.*", obj)
            continue
        own = obj.__doc__ if isinstance(obj, (types.ModuleType, type, types.FunctionType)) else inspect.getdoc(obj)
        if not (own or "").strip():
            missing.append(name)
    assert not missing, f"public names without a docstring: {missing}"


def test_every_public_name_is_in_the_reference_source():
    directives, index = _directives(), (API / "index.md").read_text(encoding="utf-8")
    absent = [n for n in diffattn.__all__ if n != "__version__" and _canonical(n) not in directives]
    assert not absent, f"no ::: directive in docs/api for {[(n, _canonical(n)) for n in absent]}"
    unlisted = [n for n in diffattn.__all__ if f"`diffattn.{n}`" not in index]
    assert not unlisted, f"docs/api/index.md's table lacks {unlisted}"
    assert all(d.startswith("diffattn.") for d in directives)


def test_nav_lists_every_page_and_the_readme_links_the_reference():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.name for p in API.glob("*.md"))
    assert sorted(re.findall(r":\s+(\w+\.md)\s*$", config, re.M)) == pages
    assert "strict: true" in config
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/api/index.md" in readme and "make docs" in readme


def test_reference_builds_strictly(tmp_path):
    """What `make docs` runs; needs the docs extra (skips without mkdocs and mkdocstrings)."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install '.[docs]' or run make docs)")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python] is not installed")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    html = (tmp_path / "site" / "layers" / "index.html").read_text(encoding="utf-8")
    assert "DiffAttentionV2" in html and "head_dim" in html
