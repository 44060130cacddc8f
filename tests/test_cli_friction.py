"""What a user reads from the ``diffattn`` command: suggestions for mistyped names, a model listing that says what
sets each model apart, help without reST markup, readable ``eval`` / ``compare`` / ``study`` output with chance
levels, and the warning for a budget shorter than its warm-up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diffattn import cli
from diffattn.app.parser import build_parser, plain_text

ROOT = Path(__file__).resolve().parents[1]
CLASSIFY = str(ROOT / "configs/tiny/classify.yaml")


@pytest.fixture(autouse=True)
def _keep_threads(one_thread):
    """In-process runs set torch's thread count (run.threads); ``one_thread`` restores it after each test."""


def error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("diffattn: error: "), err
    return err[0]


# ------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize("argv, hint", [
    (["train", CLASSIFY, "--set", "model.name=diff_vit_nanoo"], "did you mean 'diff_vit_nano'"),
    (["train", CLASSIFY, "--set", "data.name=digitz"], "did you mean 'digits'?"),
    (["train", CLASSIFY, "--set", "run.stepz=3"], "did you mean 'steps'?"),
    (["eval", "{tmp}", "--dataset", "fashon_mnist"], "did you mean 'fashion_mnist'?"),
    (["models", "diffclip_tinyy"], "did you mean 'diffclip_tiny'"),
])
def test_mistyped_names_get_a_suggestion(argv, hint, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert cli.main([*argv, "--out", str(tmp_path / "r")] if argv[0] == "train" else argv) == 2
    assert hint in error_line(capsys)
    assert not (tmp_path / "r").exists()


def test_create_model_suggests_close_names():
    import diffattn

    with pytest.raises(ValueError, match=r"unknown model 'diffclip_vit_b61'; did you mean 'diffclip_vit_b16'"):
        diffattn.create_model("diffclip_vit_b61")
    from diffattn.models.registry import model_family

    with pytest.raises(ValueError, match=r"^unknown model 'qwerty' \(diffattn"):  # nothing close: no suggestion
        model_family("qwerty")
    from diffattn.data import get_dataset

    with pytest.raises(ValueError, match=r"did you mean 'emoji'\?"):
        get_dataset("emojis")


def test_models_rows_say_what_sets_each_model_apart(capsys):
    assert cli.main(["models", "*clip*tiny"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    desc = {name: row.split("—", 1)[1].strip() for name, row in rows.items()}
    assert len(set(desc.values())) == len(desc), desc  # no two rows say the same
    assert desc["clip_tiny"].startswith("CLIP: standard attention in both towers; vision width 64, depth 2")
    assert desc["diffclip_tiny"].startswith("DiffCLIP: differential attention in both towers, λ_init 0.8;")
    assert desc["diffclip_star_tiny"].startswith("DiffCLIP*: differential attention in both towers, λ_init by "
                                                 "depth (0.8 − 0.6·exp(−0.3·l));")
    assert desc["diffclip_dagger_tiny"].startswith("DiffCLIP†: differential vision, standard text, λ_init 0.8;")
    from diffattn.models.registry import describe_model

    assert "MLP ×2," in describe_model("diff_vit_cifar_x2") and "MLP" not in describe_model("diff_vit_cifar_x4")
    assert describe_model("diff_v2_lm_tiny").startswith("Diff Transformer V2 attention; width 64, depth 2, 4 heads "
                                                        "(2 K/V)")  # V2 has no λ_init
    assert describe_model("vit_nano") == "standard attention; width 64, depth 4, 4 heads, 32 px / patch 4, classes 10"


def _parsers(parser):
    yield parser
    for action in parser._actions:
        for sub in (getattr(action, "choices", None) or {}).values() if hasattr(action, "add_parser") else ():
            yield from _parsers(sub)


def test_help_has_no_rest_markup():
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 10
    for p in parsers:
        text = p.format_help()
        assert "``" not in text and not re.search(r":[a-z]+:`", text), (p.prog, text)
    train = " ".join(next(p for p in parsers if p.prog == "diffattn train").format_help().split())
    assert "Train a model from a YAML recipe" in train and "torchrun --nproc_per_node 2 -m diffattn train" in train
    assert plain_text("``a`` :func:`~x.y.f` :mod:`x.y`") == "a f x.y"


# ------------------------------------------------------------------------- other libraries' progress bars


def test_library_bars_follow_diffattns_rule():
    import io

    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    from diffattn.progress import library_bars

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    hf_logging.enable_progress_bar()
    hub.enable_progress_bars()
    try:
        assert library_bars(True, Terminal()) is True  # a terminal: nothing changes
        assert hf_logging.is_progress_bar_enabled() and not hub.are_progress_bars_disabled()
        assert library_bars(False, Terminal()) is False  # --no-progress
        assert not hf_logging.is_progress_bar_enabled() and hub.are_progress_bars_disabled()
        hf_logging.enable_progress_bar()
        hub.enable_progress_bars()
        assert library_bars(True, io.StringIO()) is False  # a log file: no bars, as diffattn's own
        assert not hf_logging.is_progress_bar_enabled() and hub.are_progress_bars_disabled()
    finally:
        hf_logging.enable_progress_bar()
        hub.enable_progress_bars()


def test_transformers_bars_stay_out_of_a_log_file(tmp_path):
    """A run whose stderr is a file (not a terminal) gets no "Writing model shards" bar from transformers."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}  # diffattn's rule alone
    env["PYTHONPATH"] = str(ROOT / "src")
    with open(tmp_path / "log.txt", "w") as log:
        subprocess.run([sys.executable, "-m", "diffattn", "train", "tiny/retrofit", "--out", str(tmp_path / "run"),
                        "--set", "run.steps=2", "--set", "run.ckpt_every=2", "--set", "data.name=sklearn_text"],
                       stdout=log, stderr=subprocess.STDOUT, env=env, check=True, timeout=300, cwd=tmp_path)
    text = (tmp_path / "log.txt").read_text()
    assert "trained 2 steps" in text
    assert "Writing model shards" not in text and "Loading weights" not in text and "it/s]" not in text, text
    assert (tmp_path / "run" / "adapter").is_dir()  # saved through transformers / peft, where the bar was


# ------------------------------------------------------------------- eval, compare and study output


RESULTS = {"model": {"path": "/runs/r/model", "name": "diff_vit_nano", "architecture": "VisionTransformer",
                     "kind": "vit", "params": 52330, "seed": 0},
           "protocol": "quick", "eval_seed": 0, "skipped": {},
           "vision": {"classification": {"top1": 0.08, "top5": 0.5664}, "noise": {"0.0": 0.08, "0.5": 0.07},
                      "corruptions": {"table": {"blur": {"1": 0.07}}, "clean": 0.08, "mean_accuracy": 0.07,
                                      "mce": 93.0},
                      "chance": {"classification.top1": 0.1, "classification.top5": 0.5},
                      "diagnostics": {"layers": 1}, "plots": ["maps.png"]},
           "seconds": 2.7, "output_dir": "/runs/r/eval"}


def test_eval_prints_the_reports_table_and_json_on_request(monkeypatch, tmp_path, capsys):
    import json

    from diffattn.eval import runner

    monkeypatch.setattr(runner, "evaluate", lambda *a, **k: json.loads(json.dumps(RESULTS)))
    assert cli.main(["eval", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:6] == [
        "diff_vit_nano (VisionTransformer, 52,330 parameters): quick protocol, 2.7 s", "", "vision", "",
        "| metric | value | chance |", "|---|---:|---:|"]
    assert "| classification.top1 | 0.0800 **(at or below chance)** | 0.1000 |" in out
    assert "| classification.top5 | 0.5664 | 0.5000 |" in out and "| noise.0.5 | 0.0700 |  |" in out
    assert "| corruptions.mce | 93.0000 |  |" in out and "{" not in out
    assert out.rstrip().endswith("wrote results.json and report.md to /runs/r/eval")
    assert max(map(len, out.splitlines())) < 120  # no 1,000-character line
    assert cli.main(["eval", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == RESULTS


def _results(folder: Path, top1: float, classes: int = 10) -> Path:
    import json

    folder.mkdir(parents=True)
    res = {"model": {}, "vision": {"classification": {"top1": top1}, "noise": {"0.5": top1 / 2},
                                   "chance": {"classification.top1": 1 / classes}}}
    (folder / "results.json").write_text(json.dumps(res))
    return folder


def test_compare_states_chance_and_warns_about_single_seeds(tmp_path, capsys):
    a, b = _results(tmp_path / "a", 0.3), _results(tmp_path / "b", 0.35)
    assert cli.main(["compare", str(a), str(b), "--labels", "ViT", "DiffViT"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "| metric | better | chance | ViT (n=1) | DiffViT (n=1) | Δ DiffViT |"
    assert lines[2] == "| vision.classification.top1 | ↑ | 0.1000 | 0.3000 | 0.3500 | +0.0500 |"
    assert lines[3] == "| vision.noise.0.5 | ↑ |  | 0.1500 | 0.1750 | +0.0250 |"
    assert "n = 1 for ViT, DiffViT: one evaluated run (one seed) per column. At this size single seeds vary by " \
           "several points" in out
    seeds = tmp_path / "seeds"  # a folder of several seeds is one column with n = 2: no note
    _results(seeds / "s0", 0.3)
    _results(seeds / "s1", 0.4)
    _results(tmp_path / "c", 0.3, classes=16)
    assert cli.main(["compare", str(seeds), str(tmp_path / "c"), "--labels", "A", "C"]) == 0
    out = capsys.readouterr().out
    assert "| vision.classification.top1 | ↑ | varies | 0.3500 ± 0.0500 | 0.3000 | -0.0500 |" in out
    assert "n = 1 for C:" in out and "n = 1 for A" not in out


def test_study_tables_carry_chance():
    from diffattn.studies.report import Metric, aggregate, markdown_table

    clip = {"zero_shot": {"top1": 0.2}, "chance": {"zero_shot.top1": 0.0625}}
    per_seed = {s: {"A": {"acc": 0.5 + s / 10, "clip": clip, "loss": 1.0},
                    "B": {"acc": 0.6, "clip": {"zero_shot": {"top1": 0.3}}, "loss": 2.0}} for s in range(2)}
    rows = aggregate(per_seed, [Metric("accuracy (%)", "acc", 100.0, 1, chance=0.1),
                                Metric("zero-shot (%)", "clip.zero_shot.top1", 100.0, 1), Metric("loss", "loss")])
    assert [r["chance"] for r in rows] == [pytest.approx(10.0), pytest.approx(6.25), None]
    table = markdown_table(rows, ["A", "B"], 2).splitlines()
    assert table[0] == "| metric (mean ± std over 2 seeds) | A | B | chance |"
    assert table[2].endswith(" | 10.0 |") and table[3].endswith(" | 6.2 |") and table[4].endswith(" |  |")


def test_study_help_quotes_the_measured_wall_times(capsys):
    from diffattn.studies import study_names
    from diffattn.studies.config import WALL_TIMES

    assert list(WALL_TIMES) == study_names()
    docs = (ROOT / "docs" / "studies.md").read_text()
    for name, wall in WALL_TIMES.items():  # the summary table's last column: "`diffattn study NAME`, TIME", the
        # end of the cell or of its (a) part
        assert re.search(rf"`diffattn study {name}`, {re.escape(wall)}( \||<br>\(b\))", docs), name
    with pytest.raises(SystemExit):
        cli.main(["study", "--help"])
    out = capsys.readouterr().out
    for name, wall in WALL_TIMES.items():
        assert re.search(rf"^  {name} +{re.escape(wall)}$", out, re.M), name


def test_a_warm_up_longer_than_the_budget_is_warned_at_config_time(tmp_path, capsys):
    assert cli.main(["train", CLASSIFY, "--out", str(tmp_path / "r"), "--set", "run.steps=2",
                     "--set", "run.progress=false", "--set", "model.overrides.depth=1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("diffattn: warning: optim.warmup_steps 10 is not shorter than run.steps 2: the learning rate "
                      "rises for the whole run and reaches only 20% of optim.lr 0.003; set optim.warmup_steps below 2 "
                      "(e.g. --set optim.warmup_steps=1)")
    from diffattn.studies import load_study
    from diffattn.studies.config import budget_warnings
    from diffattn.studies.report import warmup_text

    cfg = load_study("recall", {"steps": 20})
    (line,) = budget_warnings(cfg)
    assert line.startswith("warmup_steps 50 is not shorter than steps 20: the learning rate rises for the whole run "
                           "and reaches only 40% of lr 0.001")
    assert budget_warnings(load_study("recall")) == []
    assert warmup_text(600, 50) == "warm-up 50 then cosine"
    assert warmup_text(20, 50) == ("linear warm-up over all 20 steps (warmup_steps 50: lr reached 40% of its peak), "
                                   "no cosine decay")
