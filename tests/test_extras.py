"""diffattn.extras: the extras the commands check agree with pyproject.toml, and a missing optional package stops a
command before it writes anything, with one line naming the package and the extra."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from diffattn.cli import main
from diffattn.extras import EXTRAS, MissingExtraError, missing, require

REPO = Path(__file__).resolve().parents[1]


def _dist(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_extras_agree_with_pyproject():
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    pyproject = REPO / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("not a source checkout")
    declared = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    for extra, packages in EXTRAS.items():
        names = {_dist(r) for r in declared[extra]}
        for _, dist in packages:
            assert dist in names, f"{dist} is checked for the {extra!r} extra but pyproject's extra lacks it"
    # the test extra installs everything every command checks for, so the suite never meets these errors
    test = {_dist(r) for r in declared["test"]}
    assert {d for packages in EXTRAS.values() for _, d in packages} <= test


def test_missing_names_the_absent_distributions(monkeypatch):
    assert missing("train") == []  # the test environment has the extra
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # importlib: a None entry means "cannot be imported"
    monkeypatch.setitem(sys.modules, "yaml", None)
    assert missing("train") == ["pyyaml", "tensorboard"]
    with pytest.raises(MissingExtraError, match=r"^x needs pyyaml, tensorboard: pip install 'diffattn\[train\]'$"):
        require("train", "x")
    assert issubclass(MissingExtraError, ImportError)
    with pytest.raises(ValueError, match=r"extra must be one of \['data', 'eval', 'train'\], got 'gpu'"):
        missing("gpu")


def test_train_without_tensorboard_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    out = tmp_path / "run"
    assert main(["train", "tiny/classify", "--out", str(out), "--set", "run.steps=1"]) == 2
    err = capsys.readouterr().err
    assert err == "diffattn: error: diffattn train needs tensorboard: pip install 'diffattn[train]'\n"
    assert not out.exists()

    from diffattn.train import load_config, train

    with pytest.raises(MissingExtraError, match=r"diffattn.train.train needs tensorboard: pip install "):
        train(load_config("tiny/classify", ["run.steps=1"]), out=out)
    assert not out.exists()


def test_eval_and_data_commands_name_their_extras(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["eval", str(tmp_path)]) == 2
    assert capsys.readouterr().err == \
        "diffattn: error: diffattn eval needs matplotlib: pip install 'diffattn[eval]'\n"
    monkeypatch.setitem(sys.modules, "webdataset", None)
    assert main(["data", "export", "emoji", "--out", str(tmp_path / "shards")]) == 2
    assert capsys.readouterr().err == \
        "diffattn: error: diffattn data export needs webdataset: pip install 'diffattn[data]'\n"
    assert not (tmp_path / "shards").exists()
