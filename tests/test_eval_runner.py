"""``diffattn eval`` on tiny saved ViT, CLIP and LM models (results.json, report.md, plots) and ``diffattn compare``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from diffattn.eval.comparison import compare, flatten
from diffattn.eval.kinds import EVAL_KINDS
from diffattn.eval.runner import evaluate

TINY = {"noise_levels": (0.0, 1.0), "corruptions": ("contrast",), "severities": (1,), "episodes": 20,
        "max_images": 48, "ppl_tokens": 256, "lambada": 4, "needle_lengths": (128,), "needle_depths": (0.0, 1.0),
        "needle_trials": 1,
        "probe_max_iter": 50, "probe_fine_steps": 3}

# Real prose (Melville, Moby-Dick, 1851, ch. 1; public domain) as the language suites' text.
PROSE = ("Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and "
         "nothing particular to interest me on shore, I thought I would sail about a little and see the watery part "
         "of the world. It is a way I have of driving off the spleen and regulating the circulation. Whenever I find "
         "myself growing grim about the mouth; whenever it is a damp, drizzly November in my soul; whenever I find "
         "myself involuntarily pausing before coffin warehouses, and bringing up the rear of every funeral I meet; "
         "and especially whenever my hypos get such an upper hand of me, that it requires a strong moral principle "
         "to prevent me from deliberately stepping into the street, and methodically knocking people's hats off, "
         "then, I account it high time to get to sea as soon as I can. This is my substitute for pistol and ball. ")


def _png(path):
    return path.read_bytes()[:4] == b"\x89PNG"


def _figure_titles(monkeypatch) -> list[str]:
    """The titles (suptitle and every axes' title) of each figure the evaluation saves, in order."""
    import diffattn.diagnostics.plots as plots

    titles = []
    save = plots.save_figure

    def keep(fig, path):
        titles.append(" ".join([fig._suptitle.get_text() if fig._suptitle else ""]
                               + [ax.get_title(loc=loc) for ax in fig.axes for loc in ("left", "center")]))
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    return titles


@pytest.mark.slow
def test_eval_vit_run_on_digits(tmp_path, monkeypatch):
    from diffattn.models import create_model

    titles = _figure_titles(monkeypatch)
    model = create_model("dg_vit_nano", img_size=8, patch_size=2, in_chans=1, num_classes=10, depth=2)
    model.save_pretrained(tmp_path / "run" / "model")
    res = evaluate(tmp_path / "run", quick=True, protocol=TINY, progress=False)
    # every figure names the model, the run and the dataset
    assert len(titles) == len(res["vision"]["plots"])
    assert all("dg_vit_nano" in t and "run run" in t and "digits" in t for t in titles), titles
    out = tmp_path / "run" / "eval"
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["vision"]["classification"]["top1"] == pytest.approx(res["vision"]["classification"]["top1"])
    v = res["vision"]
    assert v["dataset"] == "digits" and v["images"] == 48 and not res["skipped"]
    assert set(EVAL_KINDS["vit"].groups) <= set(v)  # every group the kind declares
    assert 0 <= v["classification"]["top1"] <= v["classification"]["top5"] <= 1
    assert v["noise"]["0.0"] == pytest.approx(v["classification"]["top1"])  # σ = 0 is the clean input
    assert v["corruptions"]["mce"] == pytest.approx(100 - 100 * v["corruptions"]["table"]["contrast"]["1"])
    d = v["diagnostics"]
    assert d["kind"] == "gated" and len(d["gate_per_layer"]) == 2 and all(0 < g < 1 for g in d["gate_per_layer"])
    report = (out / "report.md").read_text()
    assert "### classification" in report and "mCE" in report and "gate per layer" in report
    for name in v["plots"]:
        assert f"]({name})" in report and _png(out / name)


@pytest.mark.slow
def test_eval_lm_with_text_file_and_yaml_config(tmp_path, monkeypatch):
    from diffattn.models import create_model

    titles = _figure_titles(monkeypatch)

    create_model("diff_lm_tiny", vocab_size=256, dim=32, depth=2, num_heads=4, max_seq_len=128).save_pretrained(
        tmp_path / "lm")
    (tmp_path / "prose.txt").write_text(PROSE * 3)
    (tmp_path / "eval.yaml").write_text("model: lm\ntext: prose.txt\nquick: true\nout: report\n")
    res = evaluate(tmp_path / "eval.yaml", protocol=TINY, progress=False)
    lang = res["language"]
    assert lang["tokenizer"] == "bytes" and lang["perplexity"]["tokens"] == 255
    assert set(EVAL_KINDS["lm"].groups) <= set(lang)  # every group the kind declares
    assert lang["perplexity"]["ppl"] == pytest.approx(np.exp(lang["perplexity"]["nll"]))
    assert set(lang["needle"]) == {"128"} and set(lang["needle"]["128"]) == {"0.0", "1.0"}
    assert {"answer", "noise", "ratio"} <= set(lang["attention_noise"]["signed"])
    assert len(lang["diagnostics"]["lambda_per_layer"]) == 2
    out = tmp_path / "report"
    assert (out / "report.md").is_file() and _png(out / "needle_grid.png")
    # every figure names the model, the run (its folder) and the text
    assert titles and all("diff_lm_tiny, run lm on " in t and "prose.txt" in t for t in titles), titles


class _Captions:
    """A stand-in for a caption dataset with the CaptionImages interface: 5 colour classes × 12 images."""

    COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 230, 20),
               "purple": (150, 30, 160)}

    def __init__(self, split):
        self.categories = tuple(self.COLOURS)
        self.rows = [(c, k) for c in self.categories for k in range(12)]
        self.seed = 0 if split == "train" else 1

    def __len__(self):
        return len(self.rows)

    @property
    def captions(self):
        return [f"a {c} square number {k}" for c, k in self.rows]

    @property
    def labels(self):
        return np.array([self.categories.index(c) for c, _ in self.rows])

    def load_image(self, i):
        from PIL import Image

        c, k = self.rows[i]
        rng = np.random.default_rng(1000 * self.seed + i)
        img = np.full((32, 32, 3), 255, np.uint8)
        img[8:24, 8:24] = np.clip(np.array(self.COLOURS[c]) + rng.integers(-20, 20, 3), 0, 255)
        return Image.fromarray(img)

    def load_mask(self, i):
        m = torch.zeros(32, 32, dtype=torch.bool)
        m[8:24, 8:24] = True
        return m


@pytest.mark.slow
def test_eval_clip_suite_with_caption_data(tmp_path, monkeypatch):
    import diffattn.eval.kinds.clip
    from diffattn.models import create_model

    monkeypatch.setattr(diffattn.eval.kinds.clip, "get_dataset", lambda name, split="train", **kw: _Captions(split))
    create_model("diffclip_tiny").save_pretrained(tmp_path / "clip")
    res = evaluate(tmp_path / "clip", quick=True, protocol=dict(TINY, max_images=None), dataset="colours",
                   progress=False)
    c = res["clip"]
    assert c["images"] == 60 and not c["skipped"]
    assert set(EVAL_KINDS["clip"].groups) <= set(c)  # every group the kind declares
    assert set(c["zero_shot"]) == {"top1", "top5", "mean_per_class_recall"} and c["zero_shot"]["top5"] == 1.0
    assert set(c["retrieval"]) == {f"{d}@{k}" for d in ("image_to_text", "text_to_image") for k in (1, 5, 10)}
    assert 0 <= c["linear_probe"]["accuracy"] <= 1 and c["few_shot"]["episodes"] == 20
    fg = c["foreground_attention"]["relu"]
    assert fg["inside"] >= 0 and fg["outside"] >= 0 and fg["density_ratio"] > 0
    assert (tmp_path / "clip" / "eval" / "report.md").read_text().count("![") == len(c["plots"])


def test_eval_records_missing_data_instead_of_failing(tmp_path, monkeypatch):
    from diffattn.models import create_model

    monkeypatch.setenv("DIFFATTN_DATA", str(tmp_path / "no-data"))
    create_model("diff_lm_tiny", vocab_size=256, dim=32, depth=1, num_heads=4).save_pretrained(tmp_path / "lm")
    res = evaluate(tmp_path / "lm", quick=True, protocol=TINY, progress=False)
    assert "language" not in res and "not installed" in res["skipped"]["lm"]
    assert "## skipped" in (tmp_path / "lm" / "eval" / "report.md").read_text()
    with pytest.raises(ValueError, match="protocol keys must be among"):
        evaluate(tmp_path / "lm", protocol={"episodes_": 1})
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no model saved"):
        evaluate(tmp_path / "empty")


def _fake_results(path, top1, ppl):
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps({
        "model": {"path": str(path)}, "seconds": 3.0,
        "vision": {"classification": {"top1": top1}, "plots": ["a.png"], "diagnostics": {"layers": 2}},
        "language": {"perplexity": {"ppl": ppl}}}))


def test_compare_mean_std_over_seeds(tmp_path, capsys):
    from diffattn.cli import main

    _fake_results(tmp_path / "diff" / "seed0" / "eval", 0.8, 10.0)
    _fake_results(tmp_path / "diff" / "seed1" / "eval", 0.6, 14.0)
    _fake_results(tmp_path / "std", 0.5, 20.0)
    table = compare([tmp_path / "diff", tmp_path / "std"], tmp_path / "cmp.md")
    lines = table.splitlines()
    assert lines[0] == "| metric | better | diff (n=2) | std (n=1) | Δ std |"
    # the results' own order (not sorted), the direction of better, and the difference to the first run
    assert lines[2] == "| vision.classification.top1 | ↑ | 0.7000 ± 0.1000 | 0.5000 | -0.2000 |"
    assert lines[3] == "| language.perplexity.ppl | ↓ | 12.0000 ± 2.0000 | 20.0000 | +8.0000 |"
    assert "seconds" not in table and "layers" not in table
    data = json.loads((tmp_path / "cmp.json").read_text())
    assert data["diff"]["vision.classification.top1"] == {"mean": 0.7, "std": pytest.approx(0.1), "n": 2}
    assert main(["compare", str(tmp_path / "diff"), str(tmp_path / "std"), "--labels", "A", "B"]) == 0
    assert "A (n=2)" in capsys.readouterr().out
    (tmp_path / "nothing-here").mkdir()
    with pytest.raises(ValueError, match="diffattn eval"):
        compare([tmp_path / "nothing-here"])


def test_flatten_keeps_numbers_only():
    flat = flatten({"a": {"b": 1, "c": "x", "plots": [1]}, "skipped": {"z": 1.0}, "d": True, "e": 2.5})
    assert flat == {"a.b": 1.0, "e": 2.5}


@pytest.mark.slow
def test_cli_eval_command(tmp_path, capsys):
    from diffattn.cli import main
    from diffattn.models import create_model

    create_model("diff_lm_tiny", vocab_size=256, dim=32, depth=1, num_heads=4, max_seq_len=128).save_pretrained(
        tmp_path / "lm")
    (tmp_path / "t.txt").write_text(PROSE)
    rc = main(["eval", str(tmp_path / "lm"), "--text", str(tmp_path / "t.txt"), "--quick", "--no-progress",
               "--out", str(tmp_path / "o")])
    assert rc == 0 and (tmp_path / "o" / "results.json").is_file()
    assert "wrote results.json and report.md to" in capsys.readouterr().out


# ------------------------------------------------------------------- protocol, progress, chance and compare rows


def test_stratified_subset_keeps_every_class_share_and_is_seeded():
    from diffattn.eval.sampling import stratified_subset

    labels = np.repeat(np.arange(10), [100] * 9 + [50])  # sorted by class, as test splits often are
    idx = stratified_subset(labels, 95, seed=0)
    counts = np.bincount(labels[idx], minlength=10)
    # 95 of 950 rows: each class its tenth (10, the last 5), none left out as the first 95 rows would leave 9
    assert len(idx) == 95 and counts.tolist() == [10] * 9 + [5]
    assert np.array_equal(idx, np.sort(idx)) and len(set(idx.tolist())) == 95
    assert np.array_equal(idx, stratified_subset(labels, 95, seed=0))
    assert not np.array_equal(idx, stratified_subset(labels, 95, seed=1))
    # rounding: 7 rows over 3 equal classes give 3, 2, 2 (the largest remainders, ties to the first class)
    assert np.bincount(labels[stratified_subset(labels[:300], 7)]).tolist() == [3, 2, 2]
    assert np.array_equal(stratified_subset(labels, None), np.arange(950))
    assert np.array_equal(stratified_subset(labels, 5000), np.arange(950))


def test_default_protocol_is_a_stratified_sample_with_full_for_everything():
    from diffattn.app.parser import build_parser
    from diffattn.eval.runner import PROTOCOLS

    assert PROTOCOLS["default"]["max_images"] == 2000 and PROTOCOLS["default"]["max_train_images"] == 5000
    assert PROTOCOLS["full"]["max_images"] is None and PROTOCOLS["full"]["max_train_images"] is None
    assert PROTOCOLS["quick"]["max_images"] == 256 and PROTOCOLS["quick"]["episodes"] == 200
    assert PROTOCOLS["default"]["episodes"] == PROTOCOLS["full"]["episodes"] == 5000
    args = build_parser().parse_args(["eval", "run"])
    assert args.full is False and args.quick is False
    assert build_parser().parse_args(["eval", "run", "--full"]).full is True
    # the documented numbers are the code's
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "evaluation.md").read_text(encoding="utf-8")
    assert "2,000 test images and 5,000 training images" in doc and "`--full`" in doc


class _MissingClass(_Captions):
    """The colour set and a sixth class with no test image (as the emoji test split holds 8 of its 9 categories)."""

    COLOURS = {**_Captions.COLOURS, "orange": (240, 140, 20)}

    def __init__(self, split):
        super().__init__(split)
        if split == "test":
            self.rows = [(c, k) for c, k in self.rows if c != "orange"]


@pytest.mark.slow
def test_eval_clip_reports_a_bar_per_stage_one_class_count_and_names_every_figure(tmp_path, monkeypatch, capsys):
    import diffattn.eval.kinds.clip
    from diffattn.models import create_model

    monkeypatch.setattr(diffattn.eval.kinds.clip, "get_dataset", lambda name, split="train", **kw: _MissingClass(split))
    monkeypatch.setenv("DIFFATTN_PROGRESS_EVERY", "1000")  # not a terminal: one closing line per stage
    titles = _figure_titles(monkeypatch)
    create_model("diffclip_tiny").save_pretrained(tmp_path / "tiny_run" / "model")
    (tmp_path / "tiny_run" / "config.yaml").write_text("run: {seed: 0}\n")
    res = evaluate(tmp_path / "tiny_run", quick=True, protocol=dict(TINY, max_images=None, max_train_images=48),
                   dataset="colours", progress=True)
    err = capsys.readouterr().err
    assert "evaluating diffclip_tiny (CLIP model): quick protocol, every image (the default protocol without --quick" \
        in err
    for stage, done in (("features", "108/108 images (100%)"), ("zero-shot", "6/6 class names (100%)"),
                        ("linear probe", "fits (100%)"), ("few-shot", "20/20 episodes (100%)")):
        line = next((x for x in err.splitlines() if x.startswith(f"{stage}: ")), "")
        assert done in line and "ETA" in line, (stage, err)
    c = res["clip"]
    # 48 of the 72 training images, stratified: 8 of each of the 6 classes
    assert c["images"] == 60 and c["train_images"] == 48 and res["protocol"] == "quick"
    # one class count for every row: the 6 classes the model chooses among, though the test split holds 5
    assert c["num_classes"] == 6 and not c["skipped"].get("few_shot")
    assert c["chance"]["zero_shot.top1"] == c["chance"]["linear_probe.accuracy"] == 1 / 6
    assert c["chance"]["zero_shot.mean_per_class_recall"] == c["chance"]["linear_probe.mean_per_class_recall"]
    assert (c["few_shot"]["way"], c["few_shot"]["shot"], c["few_shot"]["queries"]) == (5, 5, 6)
    assert c["chance"]["few_shot.mean"] == 1 / 5
    assert titles and all("diffclip_tiny" in t and "tiny_run" in t and "colours" in t for t in titles), titles


def test_summary_and_report_state_few_shot_way_shot_and_chance(tmp_path):
    from diffattn.eval.report import summary_table, write_report

    res = {"model": {"name": "m", "architecture": "CLIP", "params": 10, "path": "p", "kind": "clip"},
           "protocol": "default", "seconds": 1.0,
           "clip": {"few_shot": {"mean": 0.43, "std": 0.1, "episodes": 5000, "way": 5, "shot": 5, "queries": 6},
                    "zero_shot": {"top1": 0.16}, "chance": {"few_shot.mean": 0.2, "zero_shot.top1": 0.1}}}
    table = summary_table(res)
    assert "| few_shot.mean (5-way 5-shot) | 0.4300 | 0.2000 |" in table
    assert "few_shot.way" not in table and "few_shot.episodes" not in table
    report = write_report(res, tmp_path / "r.md").read_text()
    assert "### few shot (5-way 5-shot, 6 queries per class, 5000 episodes; chance 1/5)" in report


def test_compare_shows_the_eval_tables_rows_with_the_direction_tables_arrows(tmp_path):
    from diffattn.eval.report import headline_metrics

    clip = {"zero_shot": {"top1": 0.5}, "few_shot": {"mean": 0.4, "std": 0.1, "episodes": 50, "way": 5, "shot": 5,
                                                     "queries": 6},
            "linear_probe": {"accuracy": 0.6, "C": 1.0, "val_accuracy": 0.6},
            "foreground_attention": {"signed": {"inside": 0.2, "outside": 0.1}},
            "corruptions": {"clean": 0.5, "mce": 1.0, "mean_accuracy": 0.4, "table": {"contrast": {"1": 0.3}}},
            "chance": {"zero_shot.top1": 0.2, "few_shot.mean": 0.2}, "images": 40}
    path = tmp_path / "a"
    path.mkdir()
    (path / "results.json").write_text(json.dumps({"model": {}, "clip": clip}))
    lines = compare([path]).splitlines()
    shown = [line.split(" | ")[0].lstrip("| ") for line in lines[2:] if line.startswith("| clip.")]
    assert shown == [f"clip.{metric_label}" for metric_label in
                     ("zero_shot.top1", "few_shot.mean (5-way 5-shot)", "few_shot.std (5-way 5-shot)",
                      "linear_probe.accuracy", "corruptions.clean", "corruptions.mean_accuracy", "corruptions.mce")]
    assert [f"clip.{k}" for k in headline_metrics(clip)] == [s.split(" (")[0] for s in shown]
    row = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in lines[2:] if line.startswith("| ")}
    assert row["clip.few_shot.std (5-way 5-shot)"] == "" and row["clip.few_shot.mean (5-way 5-shot)"] == "↑"
    assert row["clip.corruptions.mce"] == "↓" and row["clip.zero_shot.top1"] == "↑"
