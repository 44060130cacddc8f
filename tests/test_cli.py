"""The diffattn command: the demo (CLIP vs DiffCLIP end to end on the offline pairs) and the models listing."""

from __future__ import annotations

import json

import pytest

from diffattn import cli, from_pretrained


def _need_demo_data():
    from diffattn.data import dataset_info

    missing = [n for n in cli.DEMO_DATASETS if not dataset_info(n).installed()]
    if missing:
        pytest.skip(f"the demo's data is not installed ({', '.join(missing)}): run `make data`")


def _table_rows(report: str) -> dict[str, list[str]]:
    """The report's side-by-side table as {metric: [cell per model]}."""
    rows = {}
    for line in report.splitlines():
        if line.startswith("| ") and not line.startswith("| metric") and "---" not in line:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.slow
def test_demo_end_to_end_at_a_small_size(tmp_path, capsys):
    """The demo path (pairs TSV -> diffattn train -> diffattn eval -> extra suites -> report) at 3 steps."""
    _need_demo_data()
    rc = cli.main(["demo", "--out", str(tmp_path), "--steps", "3", "--batch-size", "16", "--max-pairs", "40",
                   "--quick", "--variants", "clip", "diffclip", "--no-progress"])
    assert rc == 0
    report = (tmp_path / "report.md").read_text()
    rows = _table_rows(report)
    assert report.splitlines()[0].startswith("# DiffCLIP vs CLIP")
    assert "| metric | CLIP | DiffCLIP |" in report and "| metric | CLIP | DiffCLIP |" in capsys.readouterr().out
    pct_rows = [name for name, _, kind in cli.DEMO_ROWS if kind == "pct" and "few-shot" not in name
                and "5-way" not in name]
    for name in pct_rows:  # every accuracy / recall is a number in [0, 100] for both models
        assert len(rows[name]) == 2, name
        assert all(0.0 <= float(c) <= 100.0 for c in rows[name]), (name, rows[name])
    assert [int(c.replace(",", "")) > 100_000 for c in rows["parameters"]] == [True, True]
    assert rows["λ vision layers"][0] == "—" and len(rows["λ vision layers"][1].split(", ")) == 2
    assert all(float(c) > 0 for c in rows["CLS density in/out of mask (signed)"][:1])  # CLIP's map is positive
    res = json.loads((tmp_path / "results.json").read_text())
    s = res["summary"]
    assert list(s) == ["CLIP", "DiffCLIP"]
    # the table shows the evaluated numbers (in %, one decimal)
    top1 = s["DiffCLIP"]["clip"]["zero_shot"]["top1"]
    assert rows["zero-shot Tux Paint top-1 (16 classes)"][1] == f"{100 * top1:.1f}"
    fm = s["CLIP"]["extra"]["zero_shot_fashion_mnist"]["top1"]
    assert rows["zero-shot Fashion-MNIST top-1 (10 classes)"][0] == f"{100 * fm:.1f}"
    assert s["CLIP"]["lambda"] == {"vision": [], "text": []}
    assert all(0.0 < v < 1.0 for v in s["DiffCLIP"]["lambda"]["vision"] + s["DiffCLIP"]["lambda"]["text"])
    for plot in ("attention_maps.png", "learning_curves.png", "lambda_per_layer.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({plot})" in report
    for v in ("clip", "diffclip"):  # the saved models and each model's own eval report
        assert (tmp_path / v / "eval" / "report.md").is_file() and (tmp_path / v / "metrics.jsonl").is_file()
    model = from_pretrained(tmp_path / "diffclip" / "model")
    assert model.visual.blocks[0].attn.__class__.__name__ == "DiffAttention"


def test_demo_without_data_names_make_data(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIFFATTN_DATA", str(tmp_path / "empty"))
    assert cli.main(["demo", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "`make data`" in err and "tuxpaint_captions" in err and "fashion_mnist" in err
    assert not (tmp_path / "out").exists()


def test_demo_pairs_tsv_is_read_by_the_csv_format(tmp_path):
    _need_demo_data()
    from diffattn.data import get_dataset

    tsv = cli.demo_pairs(tmp_path, img_size=32, max_pairs=3)
    pairs = get_dataset("csv", root=tsv)
    assert len(pairs) == 6  # 3 Tux Paint + 3 emoji
    image, caption = pairs[4]
    assert image.size == (32, 32) and caption == get_dataset("emoji", split="train").captions[1]
    mtime = tsv.stat().st_mtime_ns
    assert cli.demo_pairs(tmp_path, img_size=32, max_pairs=3) == tsv and tsv.stat().st_mtime_ns == mtime  # reused


def test_demo_table_formats_every_row():
    summary = {"CLIP": {"params": 1234567, "train_seconds": 61.2, "final_loss": 2.34567,
                        "clip": {"zero_shot": {"top1": 0.25, "top5": 0.5}, "retrieval": {"image_to_text@1": 0.125}},
                        "extra": {"corruptions": {"mce": 71.25}}, "lambda": {"vision": [], "text": []}},
               "DiffCLIP": {"params": 1234999, "clip": {"zero_shot": {"top1": 0.3125}},
                            "lambda": {"vision": [0.8123, 0.7], "text": [0.5]}}}
    rows = _table_rows(cli.demo_table(summary))
    assert rows["parameters"] == ["1,234,567", "1,234,999"]
    assert rows["train time (s)"] == ["61", "—"]
    assert rows["final train loss"] == ["2.346", "—"]
    assert rows["zero-shot Tux Paint top-1 (16 classes)"] == ["25.0", "31.2"]
    assert rows["Tux Paint image→text R@1"] == ["12.5", "—"]
    assert rows["corruptions: mCE (lower is better)"] == ["71.2", "—"]
    assert rows["λ vision layers"] == ["—", "0.81, 0.70"]
    assert len(rows) == len(cli.DEMO_ROWS)


def test_models_lists_registry(capsys):
    assert cli.main(["models", "diffclip*"]) == 0
    names = capsys.readouterr().out.split()
    assert "diffclip_vit_b16" in names and all(n.startswith("diffclip") for n in names)


@pytest.mark.parametrize("argv, message", [
    (["demo", "--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["demo", "--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    (["demo", "--batch-size", "-1"], "argument --batch-size: must be >= 1, got -1"),
    (["demo", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    (["demo", "--max-pairs", "0"], "argument --max-pairs: must be >= 1, got 0"),
    (["demo", "--steps", "two"], "argument --steps: needs int, got 'two'"),
    (["demo", "--variants", "vit"], "argument --variants: invalid choice: 'vit'"),
])
def test_bad_numbers_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_version(capsys):
    import diffattn

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"diffattn {diffattn.__version__}"


def test_demo_rejects_unknown_variants(tmp_path):
    with pytest.raises(ValueError, match=r"variants must be a non-empty subset of \['clip', 'diffclip'.*got \['vit'\]"):
        cli.demo(tmp_path, ("vit",))
