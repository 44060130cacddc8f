"""Protocol (b) of the studies (diffattn.studies.protocol): the pre-registered lr rule, the tuning seeds kept apart
from the reported ones, and the plumbing that tunes every model on its own and reports each at its own lr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffattn.studies import StudyConfig, load_study, validate_study
from diffattn.studies.base import Study
from diffattn.studies.protocol import PROTOCOL_DEFAULTS, lr_text, protocol_errors, protocol_text, select_lr
from diffattn.studies.report import Control, Metric, write_study


def test_select_lr_rule_on_grid_points():
    """Highest mean area over the tuning seeds; ties to the higher final metric, then the smaller lr, then the
    shorter warm-up; any (area, final) score function."""
    def score(t):
        return t

    assert select_lr({(1e-3, 50): [(0.5, 0.0), (0.7, 0.0)], (3e-3, 50): [(0.61, 0.0), (0.6, 0.0)]},
                     score=score) == (3e-3, 50)
    assert select_lr({(1e-3, 50): [(0.6, 0.9)], (3e-3, 50): [(0.6, 0.8)]}, score=score) == (1e-3, 50)
    assert select_lr({(3e-3, 0): [(0.6, 0.9)], (3e-4, 50): [(0.6, 0.9)], (3e-4, 10): [(0.6, 0.9)]},
                     score=score) == (3e-4, 10)
    assert select_lr({1e-3: [(-2.0, -1.9)], 3e-3: [(-1.5, -2.5)]}, score=score) == 3e-3  # minus a loss: lower wins


@pytest.mark.parametrize("name", ["needles", "recall", "dgvit", "noise"])
def test_packaged_protocol_b_grids_are_preregistered_and_disjoint(name):
    """Each of the four studies ships protocol (a) by default with an lr grid around its recipe's lr (×1/3, 1, 3)
    and tuning seeds that no reported seed shares; --protocol b checks as it is."""
    cfg = load_study(name)
    assert cfg["protocol"] == "a" and len(cfg["lrs"]) == 3
    assert cfg["lrs"][0] < cfg["lr"] == cfg["lrs"][1] < cfg["lrs"][2]
    assert not set(cfg["tuning_seeds"]) & set(cfg["seeds"])
    assert load_study(name, {"protocol": "b"})["protocol"] == "b"


def test_protocol_b_validation():
    """Tuning seeds that are also reported seeds, an empty grid under (b), an unknown protocol and a bad warm-up
    grid are errors naming the key."""
    with pytest.raises(ValueError, match=r"tuning_seeds in test must be distinct integers >= 0 none of which is a "
                                         r"reported seed \(\[0, 1\]\), got \[1\]"):
        validate_study({"study": "needles", "seeds": [0, 1], "protocol": "b", "lrs": [1e-3], "tuning_seeds": [1]},
                       "test")
    with pytest.raises(ValueError, match="lrs in test must be a list of distinct numbers > 0, got"):
        validate_study({"study": "noise", "seeds": [0, 1], "protocol": "b", "tuning_seeds": [9]}, "test")
    with pytest.raises(ValueError, match="protocol in test must be one of"):
        validate_study({"study": "dgvit", "seeds": [0, 1], "protocol": "c"}, "test")
    with pytest.raises(ValueError, match="warmups in test must be distinct integers >= 0"):
        validate_study({"study": "recall", "seeds": [0, 1], "warmups": [10, 10]}, "test")
    ok = {"study": "x", "seeds": [0, 1], "lr": 1e-3, "warmup_steps": 5, **PROTOCOL_DEFAULTS}
    assert protocol_errors(ok, "test") == []  # (a) without a grid
    assert protocol_errors({**ok, "protocol": "b", "lrs": [1e-3, 3e-3], "tuning_seeds": [2, 3]}, "test") == []


class _Toy(Study):
    """A study without training: a model's score is highest at its own best lr, so protocol (b) must find it."""

    name = "toy_protocol"
    variants = {"base": "Base", "other": "Other"}
    defaults = {"lr": 1e-3, "warmup_steps": 1, **PROTOCOL_DEFAULTS}
    best = {"Base": 1e-3, "Other": 3e-3}

    def __init__(self):
        self.calls: list[tuple[list[str], list[int], float, str]] = []

    def check(self, cfg, where):
        return protocol_errors(cfg, where)

    def control(self, cfg):
        return Control("Base score", "score", -100.0)

    def run(self, cfg, progress=True):
        self.calls.append((list(cfg["variants"]), list(cfg["seeds"]), cfg["lr"], cfg["out"]))
        out = {}
        for s in cfg["seeds"]:
            out[s] = {}
            for v in cfg["variants"]:
                label = self.variants[v]
                score = -abs(cfg["lr"] - self.best[label]) * 1e3 + 0.01 * s
                out[s][label] = {"score": score, "curve": [score], "lr": cfg["lr"], "seed": s}
        return out

    def tuning_score(self, cfg, result):
        return result["curve"][0], result["score"]

    def report(self, cfg, per_seed, seconds):
        return write_study(cfg["out"], cfg, "Toy", "toy", per_seed, [Metric("score", "score", 1.0, 3)], seconds,
                           control=self.control(cfg))


def test_protocol_b_tunes_each_model_on_tuning_seeds_and_reports_fresh_seeds(tmp_path):
    toy = _Toy()
    cfg = StudyConfig(study="toy_protocol", variants=["base", "other"], seeds=[0, 1, 2], out=str(tmp_path),
                      budget={"lr": 1e-3, "warmup_steps": 1, "protocol": "b", "lrs": [3e-4, 1e-3, 3e-3],
                              "warmups": [], "tuning_seeds": [100]})
    res = toy.execute(cfg, progress=False)
    tuning_calls = [c for c in toy.calls if c[1] == [100]]
    reported_calls = [c for c in toy.calls if c[1] == [0, 1, 2]]
    assert len(tuning_calls) == 6 and len(reported_calls) == 2 and len(toy.calls) == 8
    assert all(len(c[0]) == 1 for c in toy.calls)  # one model per call: each its own lr
    assert [(c[0], c[2]) for c in reported_calls] == [(["base"], 1e-3), (["other"], 3e-3)]
    results = res["results"]
    assert results["seeds"] == [0, 1, 2]  # the tuning seed is never reported
    assert {s: {lab: r["lr"] for lab, r in v.items()} for s, v in results["per_seed"].items()} == \
        {str(s): {"Base": 1e-3, "Other": 3e-3} for s in (0, 1, 2)}
    assert results["config"]["chosen_lr"] == {"Base": {"": {"lr": 1e-3, "warmup": 1}},
                                              "Other": {"": {"lr": 3e-3, "warmup": 1}}}
    assert list(results["config"]["tuning"]["Other"][""]) == ["lr0.0003", "lr0.001", "lr0.003"]
    report = (Path(tmp_path) / "protocol_b" / "report.md").read_text()
    assert "Protocol: (b) lr tuned per model, on tuning seeds [100] (never reported)" in report
    assert "Chosen: Base: lr 0.001" in report and "Other: lr 0.003" in report
    assert "| metric (mean ± std over 3 seeds; protocol (b)) | Base | Other |" in report
    json.loads((Path(tmp_path) / "protocol_b" / "results.json").read_text())


def test_protocol_a_names_itself_and_runs_once(tmp_path):
    toy = _Toy()
    cfg = StudyConfig(study="toy_protocol", variants=["base", "other"], seeds=[0, 1], out=str(tmp_path),
                      budget={"lr": 1e-3, "warmup_steps": 1, **PROTOCOL_DEFAULTS})
    toy.execute(cfg, progress=False)
    assert toy.calls == [(["base", "other"], [0, 1], 1e-3, str(tmp_path))]
    report = (Path(tmp_path) / "report.md").read_text()
    assert "Protocol: (a) shared recipe, tuned on the Base only (favours the baseline) (lr 0.001)" in report
    assert "| metric (mean ± std over 2 seeds; protocol (a)) |" in report
    assert lr_text(cfg) == "lr 0.001"
    assert protocol_text({"seeds": [0]}, "CLIP").startswith("Protocol: (a) shared recipe, tuned on the CLIP only")


def test_recall_protocol_b_tiny(tmp_path, one_thread):
    """The recall study under protocol (b) at a tiny budget: one lr per (model, width), read back on a rerun."""
    from diffattn.studies import run_study

    cfg = {"study": "recall", "seeds": [0, 1], "tuning_seeds": [7], "lrs": [1.0e-3, 3.0e-3], "protocol": "b",
           "variants": ["standard", "diff"], "out": str(tmp_path), "steps": 4, "batch_size": 4, "warmup_steps": 1,
           "widths": [16, 32], "depth": 1, "pairs": [2, 4], "samples": 5, "eval_every": 2, "curve_samples": 5,
           "control_accuracy": 0.01}
    res = run_study(cfg, progress=False)["results"]
    chosen = res["config"]["chosen_lr"]
    assert set(chosen) == {"Transformer", "Diff Transformer"}
    assert all(set(parts) == {"w16", "w32"} and all(c["lr"] in (1e-3, 3e-3) for c in parts.values())
               for parts in chosen.values())
    for lab, parts in chosen.items():
        for part, c in parts.items():
            sweep = res["config"]["tuning"][lab][part]
            assert c["lr"] == select_lr({float(k[2:]): [(r["auc"], r["final"]) for r in rs]
                                         for k, rs in sweep.items()}, score=lambda t: t)
    assert res["seeds"] == [0, 1] and set(res["per_seed"]["0"]["Diff Transformer"]) == {"w16", "w32"}
    again = run_study(cfg, progress=False)["results"]
    assert again["per_seed"] == json.loads(json.dumps(res["per_seed"], default=float))
