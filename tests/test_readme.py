"""The README's quick start runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs(tmp_path, monkeypatch):
    text = README.read_text()
    section = text[text.index("## Quick start"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert (tmp_path / "runs" / "diffclip_tiny" / "config.json").exists()


def test_wheel_named_in_the_readme_is_the_current_version():
    """The wheel file the README tells users to install is the one ``python -m build`` writes for this version:
    ``diffattn-<__version__>-py3-none-any.whl`` (a pure-Python wheel, PEP 427 naming)."""
    from diffattn._version import __version__

    names = re.findall(r"diffattn-[^\s\"'`\[]*?\.whl", README.read_text())
    assert names, "the README names no diffattn wheel"
    assert set(names) == {f"diffattn-{__version__}-py3-none-any.whl"}, names
