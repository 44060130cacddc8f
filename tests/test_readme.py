"""The code blocks of README.md and docs/*.md marked runnable run as written: each in a fresh interpreter in an empty
folder, offline (the convention: docs/design.md, "Runnable documentation")."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- runnable -->"
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)

#: files a block leaves in its folder, beyond running without an error
WRITES = {
    "README.md: Quick start": ["runs/diffclip_tiny/config.json", "runs/diffclip_tiny/model.safetensors"],
    "README.md: Models": ["out/config.json", "out/model.safetensors", "lm.onnx"],
}


def runnable_blocks(path: Path) -> list[tuple[str, str]]:
    """(id, code) of every fenced python block of ``path`` whose fence follows a line holding just
    ``<!-- runnable -->``; the id is the file and the heading above the block (numbered when a heading has more)."""
    text = path.read_text(encoding="utf-8")
    blocks, seen = [], {}
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if before.strip() != MARK:
            continue
        if m.group(1) != "python":
            raise ValueError(f"{path.name}: {MARK} marks a {m.group(1) or 'plain'} block; only python blocks run")
        headings = re.findall(r"^#+ (.+)$", text[:m.start()], re.M)
        name = f"{path.name}: {headings[-1] if headings else 'top'}"
        seen[name] = seen.get(name, 0) + 1
        blocks.append((name if seen[name] == 1 else f"{name} #{seen[name]}", m.group(2)))
    return blocks


BLOCKS = [b for path in DOCS for b in runnable_blocks(path)]


def _missing_imports(code: str) -> list[str]:
    """The top-level packages ``code`` imports that this environment lacks (an optional extra)."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


def test_every_marker_marks_a_python_block_and_the_readme_has_its_blocks():
    """A marker that is not right above a python fence would silently leave its block untested."""
    for path in DOCS:
        marks = sum(line.strip() == MARK for line in path.read_text(encoding="utf-8").splitlines())
        assert marks == len(runnable_blocks(path)), f"{path.name}: a {MARK} line not right above a ```python fence"
    ids = [name for name, _ in BLOCKS]
    assert {"README.md: Quick start", "README.md: Models"} <= set(ids)
    assert len(ids) == len(set(ids)) >= 9


#: runs each block given as JSON [name, code] pairs with fresh globals in its own empty folder, one interpreter for
#: all (the imports once), and writes {name: None or the traceback}
_RUNNER = """
import json, os, sys, traceback
blocks, root = json.load(open(sys.argv[1])), sys.argv[2]
result = {}
for i, (name, code) in enumerate(blocks):
    os.chdir(os.path.join(root, str(i)))
    try:
        exec(compile(code, name, "exec"), {"__name__": "__main__"})
        result[name] = None
    except BaseException:
        result[name] = traceback.format_exc()[-3000:]
json.dump(result, open(sys.argv[3], "w"))
"""


@pytest.mark.slow
def test_runnable_blocks_run_as_written(tmp_path):
    """Every marked block runs without an error (their own asserts check their numbers) and writes what it says it
    writes; a block that imports an optional extra this environment lacks is left out, named in the skip."""
    blocks, skipped = [], []
    for name, code in BLOCKS:
        missing = _missing_imports(code)
        (skipped.append(f"{name} (needs {', '.join(missing)})") if missing else blocks.append((name, code)))
    for i in range(len(blocks)):
        (tmp_path / str(i)).mkdir()
    (tmp_path / "blocks.json").write_text(json.dumps(blocks), encoding="utf-8")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS=str(torch.get_num_threads()),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p))
    res = subprocess.run([sys.executable, "-c", _RUNNER, str(tmp_path / "blocks.json"), str(tmp_path),
                          str(tmp_path / "result.json")], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
    failed = {name: tb for name, tb in result.items() if tb is not None}
    assert not failed, "\n\n".join(f"{name}:\n{tb}" for name, tb in failed.items())
    for i, (name, _) in enumerate(blocks):
        for rel in WRITES.get(name, []):
            assert (tmp_path / str(i) / rel).is_file(), f"{name} wrote no {rel}"
    assert len(result) == len(BLOCKS) - len(skipped)
    if skipped:
        pytest.skip(f"ran {len(result)} blocks; left out: {'; '.join(skipped)}")


def test_wheel_named_in_the_readme_is_the_current_version():
    """The wheel file the README tells users to install is the one ``python -m build`` writes for this version:
    ``diffattn-<__version__>-py3-none-any.whl`` (a pure-Python wheel, PEP 427 naming)."""
    from diffattn._version import __version__

    names = re.findall(r"diffattn-[^\s\"'`\[]*?\.whl", README.read_text())
    assert names, "the README names no diffattn wheel"
    assert set(names) == {f"diffattn-{__version__}-py3-none-any.whl"}, names
