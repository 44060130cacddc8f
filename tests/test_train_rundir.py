"""diffattn.train.rundir: what a run may train into (never a folder replaced by accident), what a fresh start drops
and the ``config.yaml`` that rebuilds the run."""

from __future__ import annotations

import pytest

from diffattn.errors import RunExistsError, UsageError
from diffattn.train.config import load_config
from diffattn.train.rundir import check_run_dir, prepare_run_dir, write_run_config


def test_check_run_dir_refuses_to_replace_files_by_accident(tmp_path):
    run = tmp_path / "run"
    check_run_dir(run, None, False)  # absent
    run.mkdir()
    check_run_dir(run, None, False)  # empty
    for name in ("a", "b", "c", "d", "e"):
        (run / name).write_text("x")
    with pytest.raises(RunExistsError, match=r"is not empty \(a, b, c, d, …\); continue the run with --resume auto"):
        check_run_dir(run, None, False)
    check_run_dir(run, "auto", False)  # continuing it is asked for
    with pytest.raises(UsageError, match=r"holds no config.yaml \(it is not a run directory\)"):
        check_run_dir(run, None, True)
    (run / "config.yaml").write_text("{}")
    check_run_dir(run, None, True)  # a previous run: --overwrite replaces it
    with pytest.raises(UsageError, match=r"--resume and --overwrite exclude each other"):
        check_run_dir(run, "auto", True)
    with pytest.raises(UsageError, match=r"is a file; give --out a folder"):
        check_run_dir(run / "a", None, False)
    killed = tmp_path / "killed"  # a run killed before it wrote config.yaml left only its temporary files
    killed.mkdir()
    (killed / ".config.yaml.tmp").write_text("")
    check_run_dir(killed, None, True)


def test_prepare_run_dir_replaces_a_run_or_drops_what_a_fresh_start_does_not_keep(tmp_path):
    run = tmp_path / "run"
    assert prepare_run_dir(run, overwrite=False, fresh=True) is False and run.is_dir()
    for sub in ("tensorboard", "best", "checkpoints"):
        (run / sub).mkdir()
    (run / "metrics.jsonl").write_text("")
    assert prepare_run_dir(run, overwrite=False, fresh=False) is False  # resumed: everything stays
    assert sorted(p.name for p in run.iterdir()) == ["best", "checkpoints", "metrics.jsonl", "tensorboard"]
    assert prepare_run_dir(run, overwrite=False, fresh=True) is False  # resume auto without a checkpoint
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl"]
    assert prepare_run_dir(run, overwrite=True, fresh=True) is True
    assert list(run.iterdir()) == []


def test_write_run_config_loads_back_as_the_same_config(tmp_path):
    cfg = load_config("tiny/classify", ["run.steps=7", "optim.lr=2e-3", "run.progress=false"])
    write_run_config(tmp_path, cfg)
    assert load_config(tmp_path / "config.yaml") == cfg
