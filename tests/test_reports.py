"""What the reports say: plots whose labels do not overlap and whose layer axis counts whole layers, the models
listing, and the study command's options and its errors (every broken constraint at once)."""

from __future__ import annotations

import json

import pytest
import torch

from diffattn import cli
from diffattn.diagnostics import plots


@pytest.fixture
def drawn(monkeypatch):
    """Geometry of every figure the plot functions save: colour-bar / next-panel gaps and the x ticks shown."""
    seen: list[dict] = []
    save = plots._save

    def keep(fig, path):
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        bars = [ax for ax in fig.axes if hasattr(ax, "_colorbar")]
        panels = [ax for ax in fig.axes if not hasattr(ax, "_colorbar")]
        gaps = []
        for bar in bars:  # the colour bar of a panel against the panel to its right
            i = panels.index(bar._colorbar.mappable.axes)
            if i + 1 < len(panels):
                gaps.append(panels[i + 1].get_tightbbox(r).x0 - bar.get_tightbbox(r).x1)
        seen.append({"gaps": gaps,
                     "ticks": [[t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
                               for ax in panels]})
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return seen


def test_colour_bars_clear_the_next_panels_labels(drawn, tmp_path):
    a = torch.rand(2, 4, 12, 12)
    plots.plot_maps(a, a, a - 0.8 * a.flip(-1), tmp_path / "maps.png", title="layer 0")
    c = torch.rand(2, 4, 10, 10)  # CLS + 3 × 3 patches
    plots.plot_cls_maps({"A1": c, "combined": c - 0.8 * c.flip(-1), "rollout": c}, (3, 3), tmp_path / "cls.png",
                        image=torch.rand(3, 24, 24))
    for fig in drawn:
        assert fig["gaps"] and all(g > 0 for g in fig["gaps"]), fig["gaps"]


@pytest.mark.parametrize("layers", [2, 3, 12])
def test_lambda_plot_ticks_are_whole_layers(drawn, tmp_path, layers):
    plots.plot_lambdas([torch.rand(4) for _ in range(layers)], tmp_path / "lambda.png")
    (ticks,) = drawn[-1]["ticks"]
    assert ticks and all(float(t).is_integer() for t in ticks) and min(ticks) >= 0 and max(ticks) <= layers - 1


def test_models_listing_has_a_header_and_the_pretrained_tags(capsys):
    assert cli.main(["models", "clip_vit_b16"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["name", "params", "family", "attention", "pretrained", "description"]
    assert row.split()[0] == "clip_vit_b16" and " openai " in row
    assert cli.main(["models", "vit_nano", "--json"]) == 0
    (info,) = json.loads(capsys.readouterr().out)
    assert info["pretrained"] == [] and info["name"] == "vit_nano"
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["models"]
    help_text = next(a.help for a in sub._actions if a.dest == "json")
    assert help_text.startswith("a JSON list with one object per model")


def test_study_takes_out_seeds_and_set(tmp_path, monkeypatch, capsys):
    got = {}

    def fake_study(cfg, progress=True):
        got.update(cfg)
        return {"table": "| metric |", "seconds": 0.0, "report": str(tmp_path / "report.md")}

    monkeypatch.setattr(cli, "study", fake_study)
    assert cli.main(["study", "noise", "--out", str(tmp_path / "s"), "--seeds", "3", "4", "--set", "steps=7",
                     "--set", "model.dim=32", "--no-progress"]) == 0
    assert got["out"] == str(tmp_path / "s") and got["seeds"] == [3, 4] and got["steps"] == 7
    assert got["model"]["dim"] == 32 and got["model"]["depth"] == 2  # one entry of a mapping, the rest kept


def test_study_reports_every_broken_constraint_at_once(capsys):
    assert cli.main(["study", "noise", "--seeds", "1", "--set", "steps=0", "--set", "block_size=64",
                     "--set", "prompt_length=300"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("diffattn: error: ")
    for part in ("seeds in", "steps in", "prompt_length in", "must be <= block_size - 4 (60"):
        assert part in err, part


# ------------------------------------------------------------------ progress: a bar on a terminal, else lines


def test_progress_is_a_bar_on_a_terminal_and_periodic_lines_elsewhere():
    import io

    from tqdm.std import tqdm

    from diffattn.progress import LineProgress, progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    bar = progress(total=3, file=Terminal())
    assert isinstance(bar, tqdm)
    bar.close()
    log = io.StringIO()
    for _ in progress(range(10), desc="needles", file=log, every=3600):
        pass
    lines = log.getvalue().splitlines()  # quicker than a line every hour: only the final count
    assert len(lines) == 1 and lines[0].startswith("needles: 10/10 its (100%)")
    log = io.StringIO()
    bar = progress(total=4, desc="train", unit="step", file=log, every=0)
    assert isinstance(bar, LineProgress)
    for _ in range(4):
        bar.update(1)
        bar.set_postfix(loss="1.0")
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 4  # one line per refresh at every=0, no duplicate at close
    assert lines[-1].startswith("train: 4/4 steps (100%)") and lines[-1].endswith("loss=1.0")


def test_training_without_a_terminal_writes_lines_not_bar_refreshes(tmp_path, capsys, one_thread):
    from pathlib import Path

    config = str(Path(__file__).resolve().parents[1] / "configs/tiny/classify.yaml")
    assert cli.main(["train", config, "--out", str(tmp_path / "r"), "--set", "run.steps=3", "--set",
                     "model.overrides.depth=1", "--set", "run.progress=true"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "train: 3/3 steps (100%)" in err
