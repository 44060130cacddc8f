"""The diffattn command: the demo (CLIP vs DiffCLIP end to end on the offline pairs) and the models listing."""

from __future__ import annotations

import json

import pytest

from diffattn import cli, from_pretrained
from diffattn.studies import diffclip, load_study


def _need_demo_data():
    from diffattn.data import dataset_info

    missing = [n for n in diffclip.DEMO_DATASETS if not dataset_info(n).installed()]
    if missing:
        pytest.skip(f"the demo's data is not installed ({', '.join(missing)}): run `make data`")


def _table_rows(report: str) -> dict[str, list[str]]:
    """The report's side-by-side table as {metric: [cell per model]} (the chance column and the ' *' marks of
    results at or below chance left out)."""
    rows, chance = {}, False
    for line in report.splitlines():
        if line.startswith("| metric"):
            chance = line.rstrip().endswith("| chance |")
        elif line.startswith("| ") and "---" not in line:
            cells = [c.strip().removesuffix(" *") for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:-1] if chance else cells[1:]
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
    pct_rows = [name for name, _, kind in diffclip.DEMO_ROWS if kind == "pct"]
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
    for plot in ("attention_maps.png", "attention_maps_emoji.png", "learning_curves.png", "lambda_per_layer.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({plot})" in report
    # the figure redrawn from the saved models (how the README's figure is made) is the demo's own figure
    from diffattn.studies.diffclip import attention_figure

    redrawn = attention_figure(tmp_path, tmp_path / "redrawn.png", dataset="emoji")
    assert redrawn.read_bytes() == (tmp_path / "attention_maps_emoji.png").read_bytes()
    with pytest.raises(FileNotFoundError, match="run_dir"):
        attention_figure(tmp_path / "clip", tmp_path / "none.png")
    # the question: per-pair scores of the 222 held-out pairs, the control line and a verdict from the list
    assert len(s["CLIP"]["primary"]["per_pair"]) == 91 + 131
    mean_recall = s["CLIP"]["primary"]["mean_recall"]
    assert rows["held-out retrieval mean recall (the question)"][0] == f"{100 * mean_recall:.1f}"
    control, tests = res["answer"]["control"], res["answer"]["tests"]
    assert control["threshold"] == 9.6 and "**Control** (pre-registered 2026-11-27)" in report
    assert ("**passed**" in report) == control["passed"] and ("**failed**" in report) != control["passed"]
    word = tests["DiffCLIP"]["verdict"]
    assert word in cli_verdicts() and f"Verdict, DiffCLIP vs CLIP: {word}" in report
    if not control["passed"]:  # 3 steps: CLIP has not learnt to retrieve, so nothing is compared
        assert tests["DiffCLIP"]["verdict"] == "inconclusive"
    for v in ("clip", "diffclip"):  # the saved models and each model's own eval report
        assert (tmp_path / v / "eval" / "report.md").is_file() and (tmp_path / v / "metrics.jsonl").is_file()
    model = from_pretrained(tmp_path / "diffclip" / "model")
    assert model.visual.blocks[0].attn.__class__.__name__ == "DiffAttention"


def cli_verdicts() -> tuple[str, ...]:
    from diffattn.studies.diffclip import VERDICTS

    return VERDICTS


def _fake_demo(clip_pairs: list[float], diff_pairs: list[float]) -> dict:
    """A finished demo's summary for the report (what :func:`demo` hands :func:`_demo_report`), with the per-pair
    scores of the question given."""
    def variant(v: str, pairs: list[float]) -> dict:
        return {"variant": v, "params": 1000, "primary": {"per_pair": pairs, "mean_recall": sum(pairs) / len(pairs),
                                                          "chance": {"mean_recall": 0.048}},
                "clip": {"images": 91, "zero_shot": {"top1": 0.1}},
                "extra": {"corruptions": {"table": {"gaussian_noise": {"3": 0.1}}}},
                "lambda": {"vision": [], "text": []}, "eval_report": f"{v}/eval/report.md"}

    return {"CLIP": variant("clip", clip_pairs), "DiffCLIP": variant("diffclip", diff_pairs)}


def _demo_report_of(summary: dict) -> str:
    from types import SimpleNamespace

    from diffattn.studies.diffclip import compare_to_baseline
    from diffattn.studies.diffclip_demo import _demo_report

    cfg = SimpleNamespace(run=SimpleNamespace(steps=600, batch_size=64, seed=0), optim=SimpleNamespace(lr=1e-3))
    return _demo_report(summary, diffclip.demo_table(summary), ["a.png", "b.png"], 60.0, cfg, False,
                        compare_to_baseline(summary, 0))


def test_demo_report_prints_the_control_and_a_verdict():
    # CLIP at 30 % (control level 9.6 %), DiffCLIP 10 points lower on every one of 222 pairs but a few
    clip = [0.3] * 222
    diff = [0.2] * 200 + [0.3] * 22
    report = _demo_report_of(_fake_demo(clip, diff))
    assert "## The question (pre-registered 2026-11-27)" in report
    assert ("**Control** (pre-registered 2026-11-27): baseline held-out retrieval mean recall" in report
            and "must be ≥ 9.6; CLIP reached 30.0 at seed 0: **passed**." in report)
    assert "**Verdict, DiffCLIP vs CLIP: opposite** (the variant is behind, p < 0.05). DiffCLIP − CLIP = -9.01 " \
           "points" in report
    assert "## Secondary results" in report and "| zero-shot Tux Paint top-1 (16 classes) |" in report


def test_demo_verdict_is_inconclusive_when_the_control_fails():
    # CLIP at 5 %, below twice chance: DiffCLIP far ahead is still no verdict
    report = _demo_report_of(_fake_demo([0.05] * 222, [0.4] * 222))
    assert "CLIP reached 5.0 at seed 0: **failed**, so the verdict is inconclusive" in report
    assert "**Verdict, DiffCLIP vs CLIP: inconclusive** (the control failed; no test)." in report
    assert "reproduced" not in report.split("## Secondary results")[0].split("Verdicts:")[1].split("\n", 1)[1]


def test_demo_verdicts_come_from_the_fixed_list():
    from diffattn.studies.diffclip import PAPER_EFFECT, VERDICTS, verdict
    from diffattn.studies.stats import paired_test

    assert VERDICTS == ("reproduced", "opposite", "null that excludes the paper's effect size", "inconclusive")
    assert PAPER_EFFECT == 2.0  # pre-registered 2026-11-27
    base = [float(i % 7) for i in range(222)]
    up = paired_test([b + 5 + (i % 3) for i, b in enumerate(base)], base)  # +6 on every pair
    down = paired_test([b - 5 - (i % 3) for i, b in enumerate(base)], base)
    tight = paired_test([b + (0.5 if i % 2 else -0.5) for i, b in enumerate(base)], base)  # 0 ± 0.07
    wide = paired_test([b + (30.0 if i % 2 else -30.0) for i, b in enumerate(base)], base)  # 0, interval ±4
    assert [verdict(t, True) for t in (up, down, tight, wide)] == [VERDICTS[0], VERDICTS[1], VERDICTS[2], VERDICTS[3]]
    assert {verdict(t, False) for t in (up, down, tight, wide)} == {"inconclusive"}
    assert verdict(None, True) == "inconclusive"


def test_demo_without_data_names_make_data(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIFFATTN_DATA", str(tmp_path / "empty"))
    assert cli.main(["demo", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "`diffattn data prepare " in err and "`make data`" in err
    assert "tuxpaint_captions" in err and "fashion_mnist" in err
    assert not (tmp_path / "out").exists()


def test_demo_pairs_tsv_is_read_by_the_csv_format(tmp_path):
    _need_demo_data()
    from diffattn.data import get_dataset

    tsv = diffclip.demo_pairs(tmp_path, img_size=32, max_pairs=3)
    pairs = get_dataset("csv", root=tsv)
    assert len(pairs) == 6  # 3 Tux Paint + 3 emoji
    image, caption = pairs[4]
    assert image.size == (32, 32) and caption == get_dataset("emoji", split="train").captions[1]
    mtime = tsv.stat().st_mtime_ns
    assert diffclip.demo_pairs(tmp_path, img_size=32, max_pairs=3) == tsv and tsv.stat().st_mtime_ns == mtime  # reused


def test_demo_table_formats_every_row():
    summary = {"CLIP": {"params": 1234567, "train_seconds": 61.2, "final_loss": 2.34567,
                        "clip": {"zero_shot": {"top1": 0.25, "top5": 0.5}, "retrieval": {"image_to_text@1": 0.125}},
                        "extra": {"corruptions": {"mce": 71.25}}, "lambda": {"vision": [], "text": []}},
               "DiffCLIP": {"params": 1234999, "clip": {"zero_shot": {"top1": 0.3125}},
                            "lambda": {"vision": [0.8123, 0.7], "text": [0.5]}}}
    rows = _table_rows(diffclip.demo_table(summary))
    assert rows["parameters"] == ["1,234,567", "1,234,999"]
    assert rows["train time (s)"] == ["61", "—"]
    assert rows["final train loss"] == ["2.346", "—"]
    assert rows["zero-shot Tux Paint top-1 (16 classes)"] == ["25.0", "31.2"]
    assert rows["Tux Paint image→text R@1"] == ["12.5", "—"]
    assert rows["corruptions: mCE (lower is better)"] == ["71.2", "—"]
    assert rows["λ vision layers"] == ["—", "0.81, 0.70"]
    assert len(rows) == len(diffclip.DEMO_ROWS)


def test_demo_table_states_chance_and_flags_results_at_or_below_it():
    summary = {"CLIP": {"clip": {"zero_shot": {"top1": 0.099}, "chance": {"zero_shot.top1": 1 / 9}}},
               "DiffCLIP": {"clip": {"zero_shot": {"top1": 0.25}, "chance": {"zero_shot.top1": 1 / 9}}}}
    table = diffclip.demo_table(summary)
    assert table.splitlines()[0] == "| metric | CLIP | DiffCLIP | chance |"
    assert "| zero-shot Tux Paint top-1 (16 classes) | 9.9 * | 25.0 | 11.1 |" in table
    assert table.splitlines()[-1] == "\\* at or below chance (what guessing uniformly scores)."


def test_models_lists_registry(capsys):
    assert cli.main(["models", "diffclip*", "--names"]) == 0
    names = capsys.readouterr().out.split()
    assert "diffclip_vit_b16" in names and all(n.startswith("diffclip") for n in names)


def test_models_rows_and_json_give_family_attention_and_params(capsys):
    from diffattn import create_model

    assert cli.main(["models", "dg_vit_nano"]) == 0
    header, line = capsys.readouterr().out.strip().splitlines()
    params = sum(p.numel() for p in create_model("dg_vit_nano").parameters())
    assert line.split()[:5] == ["dg_vit_nano", f"{params / 1e6:.2f}M", "VisionTransformer", "gated", "—"]
    assert line.endswith("  gated differential attention, λ_init 0.8; width 64, depth 4, 4 heads, 32 px / patch 4, "
                         "classes 10")  # what sets it apart, not the family's one sentence
    assert cli.main(["models", "diffclip_dagger_tiny", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["attention"] == {"vision": "diff", "text": "standard"}
    assert row["params"] == sum(p.numel() for p in create_model("diffclip_dagger_tiny").parameters())
    assert cli.main(["models", "no_such_model*"]) == 2  # a user error: one line, status 2
    assert "no registered model matches 'no_such_model*'" in capsys.readouterr().err


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
        diffclip.demo(tmp_path, ("vit",))


def _study_yaml(tmp_path, **kw):
    import yaml

    cfg = {"study": "diffclip", "variants": ["clip", "diffclip"], "seeds": [0, 1], "steps": 2, "batch_size": 16,
           "quick": True, "max_pairs": 40, "out": str(tmp_path / "study"), **kw}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("change, message", [
    ({"seeds": [0]}, "seeds in .* must be a list of at least 2 distinct integers >= 0, got \\[0\\]"),
    ({"seeds": [1, 1]}, "must be a list of at least 2 distinct integers"),
    ({"study": "vit"}, "study in .* must be one of detection, dgvit, diffclip, llava, needles, noise, "
                       "paligemma, recall, recall_ablation, retrofit, got 'vit'"),
    ({"epochs": 3}, "unknown study keys \\['epochs'\\] in .*; valid keys for study 'diffclip'"),
    ({"variants": ["clip", "vit"]}, "variants in .* must be a list of at least 2 distinct names from"),
    ({"steps": 0}, "steps in .* must be null \\(the demo recipe's value\\) or an int >= 1, got 0"),
])
def test_study_config_errors_name_the_key(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        load_study(_study_yaml(tmp_path, **change))


def test_study_config_by_name_and_missing():
    cfg = load_study("diffclip")  # the packaged studies/diffclip recipe
    assert cfg["variants"] == ["clip", "diffclip"] and len(cfg["seeds"]) >= 3 and cfg["steps"] is None
    with pytest.raises(FileNotFoundError, match="got 'nope'"):
        load_study("nope")


def test_paired_statement_against_the_t_distribution():
    # d = (1, 2, 3): mean 2, sample std 1, t = 2 / (1 / √3) = 3.4641 with 2 degrees of freedom; two-sided
    # p = 2 · (1 − F_t2(3.4641)) = 1 − t / √(t² + 2) = 0.07418 (the t₂ cdf in closed form)
    from diffattn.studies.stats import paired_statement, paired_test

    t = 2 * 3 ** 0.5
    test = paired_test([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    assert test["p"] == pytest.approx(1 - t / (t * t + 2) ** 0.5, rel=1e-9)
    assert paired_statement(test, "DiffCLIP", "CLIP") == (
        "DiffCLIP − CLIP = +2.00 ± 1.00 [95 % CI -0.48, +4.48; d_z = +2.00] (t-test p = 0.074, sign test "
        "p = 0.25, higher on 3 of 3 seeds): no significant difference at p < 0.05")
    test = paired_test([-5.0, -5.1, -4.9, -5.0], [0.0] * 4)
    assert test["p"] < 1e-4 and paired_statement(test, "DiffCLIP", "CLIP").endswith(
        "higher on 0 of 4 seeds): DiffCLIP lower than CLIP (p < 0.05)")
    assert paired_test([0.0, 0.0], [0.0, 0.0])["p"] == 1.0


@pytest.mark.slow
def test_study_runs_seeds_and_aggregates(tmp_path, capsys):
    _need_demo_data()
    assert cli.main(["study", str(_study_yaml(tmp_path, curve_points=2)), "--no-progress"]) == 0
    res = json.loads((tmp_path / "study" / "results.json").read_text())
    report = (tmp_path / "study" / "report.md").read_text()
    assert all((tmp_path / "study" / f"seed{s}" / "report.md").is_file() for s in (0, 1))
    per_seed = [json.loads((tmp_path / "study" / f"seed{s}" / "results.json").read_text())["summary"] for s in (0, 1)]
    row = next(r for r in res["rows"] if r["key"] == "clip.zero_shot.top1")
    vals = [100 * s["DiffCLIP"]["clip"]["zero_shot"]["top1"] for s in per_seed]
    assert row["values"]["DiffCLIP"] == pytest.approx(vals)
    mean, std = sum(vals) / 2, abs(vals[0] - vals[1]) / 2 ** 0.5  # sample std (n − 1)
    assert row["summary"]["DiffCLIP"]["mean"] == pytest.approx(mean)
    assert "| zero-shot Tux Paint top-1 (16 classes) ↑ | " in report and f"{mean:.1f} ± {std:.1f}" in report
    # the control: CLIP's held-out retrieval mean recall at least twice chance (9.6 %), else no test between the
    # models; the question's section gives a verdict from the list
    control = res["control"]
    clip = [100 * s["CLIP"]["primary"]["mean_recall"] for s in per_seed]
    assert control["values"] == pytest.approx(clip) and control["threshold"] == 9.6 and control["line"] in report
    assert control["passed"] == (sum(clip) / 2 >= 9.6)
    assert res["control_status"] == ("passed" if control["passed"] else "failed")
    assert "## The question (pre-registered 2026-11-27)" in report
    assert "- **DiffCLIP vs CLIP: " + ("" if control["passed"] else "inconclusive** (no test: the control failed).") \
        in report
    assert ("DiffCLIP − CLIP = " in report) == control["passed"] == ("p_Holm" in report)
    # the curves: a checkpoint every step of 2, measured on the 48 quick-protocol test images
    for s in per_seed:
        for lab in ("CLIP", "DiffCLIP"):
            curve = s[lab]["curve"]
            assert curve["steps"] == [1, 2] and all(0 <= v <= 1 for k in ("zero_shot_top1", "image_to_text@1",
                                                                          "text_to_image@1") for v in curve[k])
            assert curve["zero_shot_top1"][-1] == pytest.approx(s[lab]["clip"]["zero_shot"]["top1"])
            assert curve["image_to_text@1"][-1] == pytest.approx(s[lab]["clip"]["retrieval"]["image_to_text@1"])
    assert not (tmp_path / "study" / "seed0" / "clip" / "checkpoints" / "step_00000001").exists()  # measured, gone
    c, d = ([100 * s[lab]["curve"]["zero_shot_top1"][0] for s in per_seed] for lab in ("CLIP", "DiffCLIP"))
    assert "## Along training" in report and "| zero-shot Tux Paint top-1: step | CLIP | DiffCLIP |" in report
    assert (f"| 1 | {sum(c) / 2:.1f} ± {abs(c[0] - c[1]) / 2 ** 0.5:.1f} | {sum(d) / 2:.1f} ± "
            f"{abs(d[0] - d[1]) / 2 ** 0.5:.1f} |") in report
    # a second run reads the finished seeds back instead of retraining them
    before = (tmp_path / "study" / "seed0" / "results.json").stat().st_mtime_ns
    assert cli.main(["study", str(_study_yaml(tmp_path, curve_points=2)), "--no-progress"]) == 0
    assert (tmp_path / "study" / "seed0" / "results.json").stat().st_mtime_ns == before
    assert "| metric (mean ± std over 2 seeds; protocol (a)) | CLIP | DiffCLIP |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, what", [
    (["study", "detection", "--seeds", "0", "1"], "diffattn study detection"),
    (["object-attention", "--results", "r.json", "--out", "t.md"], "diffattn object-attention"),
])
def test_detection_commands_without_ultralytics_are_one_line(argv, what, tmp_path, monkeypatch, capsys):
    """Ultralytics (AGPL) is never installed with the other extras: its commands stop with one line naming it, and
    write nothing."""
    import importlib.util

    from diffattn.cli import main

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ultralytics" else find(name, *a))
    monkeypatch.chdir(tmp_path)
    assert main([*argv, *(["--out", "runs"] if argv[0] == "study" else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"diffattn: error: {what} needs ultralytics (AGPL-3.0): pip install 'diffattn[detect]'"]
    assert not (tmp_path / "runs").exists()


class _Stop(Exception):
    """Raised by a stand-in to end a command once it has shown what it was given."""


def test_demo_device_reaches_the_run_config_and_eval(tmp_path, monkeypatch):
    """``diffattn demo --device cpu``: each variant's train config has run.device cpu and ``diffattn eval`` gets
    cpu; without the flag run.device stays null (cuda when torch sees a GPU, as for diffattn train)."""
    from diffattn.studies import diffclip_demo

    seen = {}

    def fake_train(cfg, out, overwrite):
        seen["run.device"] = cfg.run.device
        return {"final_loss": 1.0}

    def fake_evaluate(run_dir, out_dir, **kw):
        seen["eval"] = kw["device"]
        raise _Stop

    monkeypatch.setattr(diffclip_demo, "_check_demo_data", lambda: None)
    monkeypatch.setattr(diffclip_demo, "demo_pairs", lambda folder, max_pairs=None: tmp_path / "pairs.tsv")
    monkeypatch.setattr(diffclip_demo, "train", fake_train)
    monkeypatch.setattr(diffclip_demo, "evaluate", fake_evaluate)
    for argv, want in ((["--device", "cpu"], "cpu"), ([], None)):
        seen.clear()
        with pytest.raises(_Stop):
            cli.main(["demo", "--out", str(tmp_path / "out"), "--variants", "clip", "--steps", "2", *argv])
        assert seen == {"run.device": want, "eval": want}
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"):
        diffclip.demo(tmp_path / "out", ("clip",), device="gpu")


@pytest.mark.parametrize("argv, message", [
    (["demo", "--device", "gpu"], "argument --device: must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    (["study", "dgvit", "--device", "cuda:x"], "argument --device: must be 'cpu', 'cuda' or 'cuda:N', got 'cuda:x'"),
])
def test_demo_and_study_device_spelling_is_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_study_device_reaches_the_config_and_each_run_config(tmp_path, monkeypatch, capsys):
    """``diffattn study NAME --device cpu`` sets the config's device for the studies that train through diffattn
    train (their run.device, or the demo's device); a study that trains in-process on the CPU takes --device cpu
    and refuses cuda in one line naming the studies that take it."""
    from diffattn.app import study as commands
    from diffattn.studies import dgvit, paligemma

    assert commands.device_studies() == ["dgvit", "diffclip", "paligemma"]
    got = {}

    def fake_study(cfg, progress=True):
        got[cfg.study] = cfg
        raise _Stop

    monkeypatch.setattr(commands, "run_study", fake_study)
    for name in ("dgvit", "paligemma", "diffclip"):
        with pytest.raises(_Stop):
            cli.main(["study", name, "--device", "cpu", "--out", str(tmp_path / name)])
        assert got[name]["device"] == "cpu" and load_study(name)["device"] is None
    assert dgvit._train_config(got["dgvit"], "vit", 0, False).run.device == "cpu"
    base = {"type": "paligemma", "config": got["paligemma"]["model"]}
    assert paligemma._train_config(got["paligemma"], 0, base, ["what"], method="none", lora_r=4, steps=2, lr=1e-3,
                                   progress=False).run.device == "cpu"
    demos = []
    monkeypatch.setattr(diffclip, "demo", lambda folder, variants, **kw: demos.append(kw["device"]) or {
        "summary": {}})
    diffclip.DiffCLIPStudy().run(got["diffclip"].replace(seeds=[0, 1]), progress=False)
    assert demos == ["cpu", "cpu"]
    with pytest.raises(_Stop):
        cli.main(["study", "recall", "--device", "cpu", "--out", str(tmp_path / "recall")])
    assert "device" not in got["recall"]
    monkeypatch.setattr(commands, "resolve_device", lambda value, what: None)  # as if torch saw a GPU
    assert cli.main(["study", "recall", "--device", "cuda", "--out", str(tmp_path / "recall")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device 'cuda': study 'recall' trains in this process on the CPU" in err
    assert "(dgvit, diffclip, paligemma)" in err
    with pytest.raises(ValueError, match="device in .* must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"):
        load_study("dgvit", {"device": "tpu"})
