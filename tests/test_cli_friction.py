"""What a user reads from the ``diffattn`` command: suggestions for mistyped names, a model listing that says what
sets each model apart, help without reST markup, readable ``eval`` / ``compare`` / ``study`` output with chance
levels, and the warning for a budget shorter than its warm-up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diffattn import cli

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

    with pytest.raises(ValueError, match=r"got 'qwerty'$"):  # nothing close: no suggestion
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
    parsers = list(_parsers(cli.build_parser()))
    assert len(parsers) > 10
    for p in parsers:
        text = p.format_help()
        assert "``" not in text and not re.search(r":[a-z]+:`", text), (p.prog, text)
    train = " ".join(next(p for p in parsers if p.prog == "diffattn train").format_help().split())
    assert "Train a model from a YAML recipe" in train and "torchrun --nproc_per_node 2 -m diffattn train" in train
    assert cli.plain_text("``a`` :func:`~x.y.f` :mod:`x.y`") == "a f x.y"


# ------------------------------------------------------------------------- other libraries' progress bars


def test_library_bars_follow_diffattns_rule(monkeypatch):
    import io

    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    from diffattn.progress import library_bars

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    try:
        assert library_bars(True, Terminal()) is True  # a terminal: nothing changes
        assert hf_logging.is_progress_bar_enabled() and "HF_HUB_DISABLE_PROGRESS_BARS" not in __import__("os").environ
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

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    env["PYTHONPATH"] = str(ROOT / "src")
    with open(tmp_path / "log.txt", "w") as log:
        subprocess.run([sys.executable, "-m", "diffattn", "train", "tiny/retrofit", "--out", str(tmp_path / "run"),
                        "--set", "run.steps=2", "--set", "run.ckpt_every=2", "--set", "data.name=sklearn_text"],
                       stdout=log, stderr=subprocess.STDOUT, env=env, check=True, timeout=300, cwd=tmp_path)
    text = (tmp_path / "log.txt").read_text()
    assert "trained 2 steps" in text
    assert "Writing model shards" not in text and "Loading weights" not in text and "it/s]" not in text, text
    assert (tmp_path / "run" / "adapter").is_dir()  # saved through transformers / peft, where the bar was
