"""What the reports say: plots whose labels do not overlap and whose layer axis counts whole layers, the models
listing, and the study command's options and its errors (every broken constraint at once)."""

from __future__ import annotations

import json

import pytest
import torch

from diffattn import cli
from diffattn.app.parser import build_parser
from diffattn.diagnostics import plots


@pytest.fixture
def drawn(monkeypatch):
    """Geometry of every figure the plot functions save: colour-bar / next-panel gaps and the x ticks shown."""
    seen: list[dict] = []
    save = plots.save_figure

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

    monkeypatch.setattr(plots, "save_figure", keep)
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
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["models"]
    help_text = next(a.help for a in sub._actions if a.dest == "json")
    assert help_text.startswith("a JSON list with one object per model")


def test_study_takes_out_seeds_and_set(tmp_path, monkeypatch, capsys):
    got = {}

    def fake_study(cfg, progress=True):
        got.update(cfg)
        return {"table": "| metric |", "seconds": 0.0, "report": str(tmp_path / "report.md")}

    monkeypatch.setattr("diffattn.app.study.run_study", fake_study)  # what the study command calls
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


# ------------------------------------------------------------------- what each figure says on itself


@pytest.fixture
def figures(monkeypatch):
    """Every figure the plot functions save, drawn, kept open for the test to read its matplotlib objects."""
    seen = []
    save = plots.save_figure

    def keep(fig, path):
        fig.canvas.draw()
        seen.append({"axes": [ax for ax in fig.axes if not hasattr(ax, "_colorbar")],
                     "bars": [ax for ax in fig.axes if hasattr(ax, "_colorbar")], "suptitle": fig._suptitle})
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    return seen


def test_maps_share_one_scale_for_a1_a2_and_state_every_scale(figures, tmp_path):
    a1, a2 = torch.rand(1, 2, 5, 5).softmax(-1), torch.rand(1, 2, 5, 5).softmax(-1)
    plots.plot_maps(a1, a2, a1 - 1.5 * a2, tmp_path / "m.png", cls=True)
    (fig,) = figures
    ims = [ax.images[0] for ax in fig["axes"]]
    assert ims[0].get_clim() == ims[1].get_clim() and ims[0].get_clim()[0] == 0  # A1 and A2: one scale from 0
    lo, hi = ims[2].get_clim()
    assert lo == -hi  # the signed map: centred on 0
    assert len(fig["bars"]) == 2  # one bar for A1 and A2, one for A1 − λA2
    titles = [ax.get_title() for ax in fig["axes"]]
    assert titles[0].startswith("A1\nscale 0 to") and "shared with A2" in titles[0]
    assert titles[2].startswith("A1 − λA2\nscale ±")
    assert [ax.get_xlabel() for ax in fig["axes"]] == ["key token (0 = CLS)"] * 3
    assert [ax.get_ylabel() for ax in fig["axes"]] == ["query token (0 = CLS)"] * 3


def test_a_uniform_map_says_so_and_rollout_is_explained(figures, tmp_path):
    flat = torch.full((1, 2, 10, 10), 0.1)
    plots.plot_maps(flat, None, flat, tmp_path / "m.png")
    texts = [t.get_text() for t in figures[0]["axes"][0].texts]
    assert texts == ["uniform: every key gets 1/10\n(entropy = log 10)"]
    peaked = torch.rand(1, 2, 10, 10).softmax(-1) ** 4
    plots.plot_cls_maps({"A1": flat, "rollout": peaked}, (3, 3), tmp_path / "c.png", title="vit")
    fig = figures[1]
    assert [t.get_text() for t in fig["axes"][0].texts] == ["uniform: every key gets 1/9\n(entropy = log 9)"]
    assert len(fig["axes"][1].texts) == 0
    assert fig["suptitle"].get_text() == "vit\n" + plots.ROLLOUT_NOTE and "Abnar & Zuidema" in plots.ROLLOUT_NOTE
    assert [ax.get_xlabel() for ax in fig["axes"]] == ["patch column"] * 2
    assert [ax.get_ylabel() for ax in fig["axes"]] == ["patch row"] * 2
    assert all(ax.get_title().startswith("CLS → patches: ") and "\nscale " in ax.get_title() for ax in fig["axes"])
    assert len(fig["bars"]) == 2  # each panel its own scale, stated in its title
    assert not plots.is_uniform(peaked) and plots.is_uniform(flat)


@pytest.mark.parametrize("per_head", [False, True])
def test_lambda_legend_names_only_what_is_drawn(figures, tmp_path, per_head):
    values = [torch.rand(4) if per_head else torch.tensor(0.2 + 0.1 * i) for i in range(3)]
    plots.plot_lambdas(values, tmp_path / "l.png")
    (ax,) = figures[0]["axes"]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(labels) and labels == (["mean λ", "min–max over heads / tokens"] if per_head else ["λ per layer"])
    assert len(ax.collections) == (1 if per_head else 0)  # the band exists only when there is a spread


def test_severity_ticks_are_the_whole_severities_measured(figures, tmp_path):
    plots.plot_corruption_curves({"blur": {1: 0.9, 3: 0.7, 5: 0.4}, "noise": {"1": 0.8, "3": 0.5, "5": 0.2}},
                                 tmp_path / "c.png", clean=0.95)
    (ax,) = figures[0]["axes"]
    assert list(ax.get_xticks()) == [1, 3, 5]
    assert all(label.get_text() for label in ax.get_legend().get_texts())


def test_readme_attention_figure_states_each_rows_scale(figures, tmp_path):
    """The README figure (studies.diffclip.attention_figure): rows of very different ranges each say their scale."""
    import numpy as np

    from diffattn.studies.diffclip_plots import plot_attention

    n, grid = 3, (4, 4)
    masks = torch.zeros(n, 16, 16, dtype=torch.bool)
    masks[:, 4:12, 4:12] = True
    cls_maps = {"CLIP": torch.rand(n, 16).softmax(-1) * 0.3, "DiffCLIP": (torch.rand(n, 16) - 0.5) * 0.02,
                "flat": torch.full((n, 16), 1 / 16)}
    plot_attention(torch.zeros(n, 3, 16, 16), masks, cls_maps, grid, tmp_path / "f.png",
                    np.zeros((n, 16, 16, 3), dtype=np.uint8),
                    {"CLIP": "standard", "DiffCLIP": "diff", "flat": "standard"})
    (fig,) = figures
    rows = [ax.get_title(loc="left") for ax in fig["axes"] if ax.get_title(loc="left")][1:]  # after "image"
    assert rows[0].startswith("CLIP (softmax): own colour scale, 0 to 0.")
    assert rows[1].startswith("DiffCLIP (differential: A1 − λA2, signed): own colour scale, ±0.0")
    assert "own colour scale" in fig["suptitle"].get_text() and "4×4 patch grid" in fig["suptitle"].get_text()
    assert len(fig["bars"]) == 3
    flat_row = fig["axes"][-n:]
    assert all([t.get_text() for t in ax.texts] == ["uniform"] for ax in flat_row)
    assert all(ax.get_xlabel() == "patch column" for ax in flat_row)


def test_attention_figure_titles_a_row_by_its_layers_kind_never_its_sign(figures, tmp_path):
    """A differential map that happens to have no negative entry is still titled differential (and drawn on the
    signed scale); a softmax map is titled softmax whatever its values."""
    import numpy as np

    from diffattn.studies.diffclip_plots import plot_attention

    n, grid = 2, (4, 4)
    masks = torch.zeros(n, 16, 16, dtype=torch.bool)
    cls_maps = {"DiffCLIP": torch.rand(n, 16) * 0.01, "CLIP": torch.rand(n, 16).softmax(-1),
                "Gated": torch.rand(n, 16) * 0.02}
    plot_attention(torch.zeros(n, 3, 16, 16), masks, cls_maps, grid, tmp_path / "f.png",
                    np.zeros((n, 16, 16, 3), dtype=np.uint8),
                    {"DiffCLIP": "diff", "CLIP": "standard", "Gated": "gated"})
    (fig,) = figures
    rows = [ax.get_title(loc="left") for ax in fig["axes"] if ax.get_title(loc="left")][1:]
    assert bool((cls_maps["DiffCLIP"] >= 0).all())
    assert rows[0].startswith("DiffCLIP (differential: A1 − λA2, signed): own colour scale, ±")
    assert rows[1].startswith("CLIP (softmax): own colour scale, 0 to ")
    assert rows[2].startswith("Gated (gated differential: A1 − λA2, signed): own colour scale, ±")
    diff_im = fig["axes"][n].images[0]  # the first map of the DiffCLIP row: centred on 0
    lo, hi = diff_im.get_clim()
    assert lo == -hi < 0


def test_per_layer_plot_has_no_offset_and_keeps_its_baseline_and_reference(figures, tmp_path):
    """Entropies of 1.0986 ± 0.0002 nats: ticks are the values (no "+1.0986" offset) and the y range reaches the
    baseline 0 and the uniform value, so the spread is drawn at its true size."""
    values = [torch.tensor([1.0985, 1.0987]), torch.tensor([1.0986, 1.0988]), torch.tensor([1.0984, 1.0986])]
    plots.plot_lambdas(values, tmp_path / "e.png", label="A1 row entropy (nats)", baseline=0.0,
                       reference=(1.2, "uniform causal map"))
    plots.plot_lambdas(values, tmp_path / "plain.png")
    (fig, plain) = figures
    (ax,) = fig["axes"]
    assert ax.yaxis.get_offset_text().get_text() == "" and ax.yaxis.get_major_formatter().get_useOffset() is False
    lo, hi = ax.get_ylim()
    assert lo <= 0.0 and 1.2 <= hi < 1.4
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1] == "uniform causal map"
    assert ax.get_ylabel() == "A1 row entropy (nats)"
    (pax,) = plain["axes"]  # without a baseline the range is the data's, still without an offset
    assert pax.yaxis.get_offset_text().get_text() == "" and pax.get_ylim()[0] > 1.09
