"""Registrations (diffattn.studies.registration, diffattn.studies.provenance): every committed registration file
validates, the minimum detectable difference is computed for the registered test, and committed results strictly
follow the commit of their registration (shown to fail on a temporary git repository)."""

from __future__ import annotations

import copy
import json
import math
import shutil
import subprocess
from pathlib import Path
from statistics import NormalDist

import pytest
import yaml

from diffattn.studies.provenance import (
    REGISTRATIONS,
    RESULTS,
    added_in,
    git_root,
    registration_status,
    results_descend_errors,
)
from diffattn.studies.registration import (
    MIN_SEEDS,
    load_registration,
    load_registrations,
    used_seeds,
    validate_registration,
)
from diffattn.studies.report import Control, Metric, write_study
from diffattn.studies.stats import min_detectable_difference, t_quantile

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / REGISTRATIONS
HAS_GIT = shutil.which("git") is not None


# -- the registrations of this checkout ----------------------------------------------------------------------------

def test_every_registration_file_validates():
    regs = load_registrations(ROOT)
    assert set(regs) == {p.stem for p in FOLDER.glob("*.yaml")} and len(regs) >= 10
    for reg in regs.values():
        assert len(reg.seeds) >= MIN_SEEDS and not set(reg.seeds) & used_seeds(reg.study)
        assert not set(reg.seeds) & set(reg.tuning_seeds)
        assert reg.mdd == pytest.approx(
            min_detectable_difference(reg.assumed_std, len(reg.seeds), test=reg.test), rel=1e-12)
        assert (ROOT / reg.config).is_file()
    # the headline family: every question against the Transformer, one Holm family
    headline = regs["recall_v1_lambda08"].holm_family
    assert {regs[n].baseline for n in headline} == {"standard"} and len(headline) == 7
    assert regs["diffclip_retrieval"].mdd < regs["diffclip_retrieval"].paper_effect["value"]  # 24 seeds detect +0.8
    assert not regs["recall_gda_4to1"].runnable and regs["recall_v1_lambda08"].runnable


def test_used_seeds_are_shared_by_studies_on_one_stream():
    assert {0, 1, 2, 3, 4, 10, 14, 100} <= used_seeds("needles")  # recall_ablation's 10-14 count for needles too
    assert used_seeds("recall") == used_seeds("recall_ablation")
    assert 10 not in used_seeds("diffclip") and 4 in used_seeds("diffclip")


def _raw(name: str = "recall_v1_lambda08") -> dict:
    return yaml.safe_load((FOLDER / f"{name}.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("question"), r"misses the fields \['question'\]"),
    (lambda d: d.update(extra=1), r"unknown fields \['extra'\]"),
    (lambda d: d.update(confirmatory=False), "confirmatory in .* must be true"),
    (lambda d: d.update(study="nope"), "study in .* must be one of"),
    (lambda d: d.update(test="wilcoxon"), "test in .* must be one of paired_test, sign_test_p"),
    (lambda d: d.update(seeds=list(range(200, 207))), "seeds in .* must be a list of at least 8 distinct integers"),
    (lambda d: d.update(seeds=list(range(8))), r"seeds in .* must be fresh.*got \[0, 1, 2, 3, 4\] among them"),
    (lambda d: d.update(tuning_seeds=[200]), r"tuning_seeds in .* must be disjoint .* got \[200\]"),
    (lambda d: d["minimum_detectable_difference"].update(value=3.0),
     r"minimum_detectable_difference.value in .* must be .*: 4.97, got 3.0"),
    (lambda d: d["comparison"].update(variant="gda_r9"), "comparison.variant in .* must be a variant of study"),
    (lambda d: d.update(holm_family=["recall_v2"]), "holm_family in .* must list this registration"),
    (lambda d: d["paper_effect"].pop("scaling_argument"), "paper_effect in .* must be a mapping with exactly the keys"),
    (lambda d: d["budget"].update(wall_minutes=0), "budget.wall_minutes in .* must be a finite number > 0"),
    (lambda d: d.update(config="studies/registrations/configs/missing.yaml"), r"config in .*\(no such file\)"),
    (lambda d: d.update(exclusion_rules=[]), "exclusion_rules in .* must be a list of at least 1"),
])
def test_validation_names_the_field(change, message):
    data = copy.deepcopy(_raw())
    change(data)
    with pytest.raises(ValueError, match=message):
        validate_registration(data, "recall_v1_lambda08", "recall_v1_lambda08.yaml", ROOT)


def test_a_missing_variant_is_allowed_only_when_needs_names_it_and_the_config_must_match():
    data = copy.deepcopy(_raw("recall_gda_4to1"))
    data["comparison"]["variant"] = "gda_r9"  # a variant the study does not have
    data["needs"] = ["recall_ablation: a variant gda_r9"]
    with pytest.raises(ValueError) as named:  # named in needs: only the config (which trains gda_r4) is wrong
        validate_registration(data, "recall_gda_4to1", "x", ROOT)
    assert "must be a variant of study" not in str(named.value) and "must train both" in str(named.value)
    data["needs"] = []
    with pytest.raises(ValueError, match="comparison.variant in x must be a variant of study 'recall_ablation'"):
        validate_registration(data, "recall_gda_4to1", "x", ROOT)
    # a runnable registration's config must load as a study config and run the registered seeds
    data = copy.deepcopy(_raw())
    with pytest.raises(ValueError, match="must name this registration in `registrations`"):
        validate_registration(data, "another_name", "x", ROOT)


def test_load_registrations_checks_holm_families_together(tmp_path):
    folder = tmp_path / REGISTRATIONS
    (folder / "configs").mkdir(parents=True)
    shutil.copy(FOLDER / "configs" / "recall_headline.yaml", folder / "configs" / "recall_headline.yaml")
    for name in ("recall_v1_lambda08", "recall_v2"):
        data = _raw(name)
        data["holm_family"] = [name] if name == "recall_v2" else ["recall_v1_lambda08", "recall_v2"]
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    with pytest.raises(ValueError, match=r"holm_family in .*recall_v1_lambda08.yaml must be the same family in each "
                                         r"of its members, but \['recall_v2'\] list other families"):
        load_registrations(tmp_path)
    assert load_registration(folder / "recall_v2.yaml", tmp_path).holm_family == ("recall_v2",)


# -- the minimum detectable difference -----------------------------------------------------------------------------

def test_min_detectable_difference_per_test():
    # normal approximation (unchanged): (1.95996 + 0.84162) · 2 / √4
    assert min_detectable_difference(2.0, 4) == pytest.approx(2.80158, abs=1e-4)
    # paired t: (t_{0.975, 7} + t_{0.8, 7}) / √8 = (2.36462 + 0.89603) / 2.82843
    assert t_quantile(0.975, 7) == pytest.approx(2.36462, abs=1e-4)
    assert t_quantile(0.8, 7) == pytest.approx(0.89603, abs=1e-4)
    assert min_detectable_difference(1.0, 8, test="paired_test") == pytest.approx(1.15282, abs=1e-4)
    assert min_detectable_difference(5.0, 10, test="paired_test") == pytest.approx(4.97357, abs=1e-4)
    # sign test with 8 seeds rejects only 0 or 8 wins (2 / 2⁸ = 0.0078; 1 win: 18 / 256 = 0.07): power π⁸ + (1 − π)⁸
    # = 0.8 at π = 0.97249, δ = Φ⁻¹(π) = 1.91876
    mdd = min_detectable_difference(1.0, 8, test="sign_test_p")
    assert mdd == pytest.approx(1.91876, abs=1e-4)
    pi = NormalDist().cdf(mdd)
    assert pi ** 8 + (1 - pi) ** 8 == pytest.approx(0.8, abs=1e-9)
    # with 5 seeds neither the sign test nor the permutation test can reach 0.05 (2 / 2⁵ = 0.0625)
    assert math.isinf(min_detectable_difference(1.0, 5, test="sign_test_p"))
    assert math.isinf(min_detectable_difference(1.0, 5, test="censored_paired_test"))
    assert min_detectable_difference(1.0, 6, test="permutation_p") == pytest.approx(
        min_detectable_difference(1.0, 6, test="paired_test"))
    with pytest.raises(ValueError, match="test must be one of paired_test, sign_test_p, permutation_p"):
        min_detectable_difference(1.0, 8, test="wilcoxon")
    with pytest.raises(ValueError, match="power must be a number in"):
        min_detectable_difference(1.0, 8, power=1.5)


# -- results strictly after their registration (git) ---------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text, encoding="utf-8")
    _git(repo, "add", *files)
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    if not HAS_GIT:
        pytest.skip("git is not installed")
    _git(tmp_path, "init", "-q", "-b", "main")
    _commit(tmp_path, {"README": "x\n"}, "start")
    return tmp_path


REG = yaml.safe_dump({"study": "recall", "seeds": [200, 201], "primary_endpoint": "w64.auc",
                      "comparison": {"variant": "diff", "baseline": "standard"}, "test": "paired_test"})


def test_results_after_their_registration_pass(repo):
    assert results_descend_errors(repo) == []  # no results folder: nothing to check
    first = _commit(repo, {f"{REGISTRATIONS}/q.yaml": REG}, "register q")
    assert added_in(repo / REGISTRATIONS / "q.yaml") == [first]
    _commit(repo, {f"{RESULTS}/q/results.json": "{}"}, "results of q")
    assert results_descend_errors(repo) == []


def test_results_in_the_registration_commit_fail(repo):
    _commit(repo, {f"{REGISTRATIONS}/q.yaml": REG, f"{RESULTS}/q/results.json": "{}"}, "both at once")
    errors = results_descend_errors(repo)
    assert len(errors) == 1 and "does not strictly descend from commit" in errors[0]


def test_results_on_a_branch_before_the_registration_fail(repo):
    _git(repo, "checkout", "-q", "-b", "early")
    _commit(repo, {f"{RESULTS}/q/results.json": "{}"}, "results first, on a side branch")
    _git(repo, "checkout", "-q", "main")
    _commit(repo, {f"{REGISTRATIONS}/q.yaml": REG}, "register q afterwards")
    _git(repo, "merge", "-q", "--no-edit", "early")
    errors = results_descend_errors(repo)
    assert len(errors) == 1 and f"{RESULTS / 'q'} has files added in commit" in errors[0]


def test_results_without_a_committed_registration_fail(repo):
    _commit(repo, {f"{RESULTS}/orphan/results.json": "{}"}, "results with no registration")
    assert results_descend_errors(repo) == [f"{RESULTS / 'orphan'} has no committed registration "
                                            f"{REGISTRATIONS / 'orphan.yaml'}"]


def test_committed_results_of_this_checkout_follow_their_registrations():
    if not HAS_GIT:
        pytest.skip("git is not installed")
    if git_root(ROOT) is None:
        pytest.skip(f"{ROOT} is not a git checkout")
    assert results_descend_errors(ROOT) == []


# -- what a report says ----------------------------------------------------------------------------------------------

def test_registration_status_labels(repo):
    cfg = {"study": "recall", "seeds": [200, 201], "registrations": ["q"]}
    assert registration_status({"study": "recall"}, repo)["lines"][0].startswith("Registration: unregistered: "
                                                                                 "exploratory")
    (repo / REGISTRATIONS).mkdir(parents=True)
    (repo / REGISTRATIONS / "q.yaml").write_text(REG, encoding="utf-8")
    status = registration_status(cfg, repo)
    assert status["label"] == "exploratory" and "not committed" in status["registrations"][0]["reason"]
    commit = _commit(repo, {f"{REGISTRATIONS}/q.yaml": REG}, "register q")
    status = registration_status(cfg, repo)
    assert status["label"] == "confirmatory" and status["registrations"][0]["commit"] == commit
    line = status["lines"][0]
    assert f"added in commit {commit}: **confirmatory** for w64.auc, diff − standard (paired_test)" in line
    other = registration_status({**cfg, "seeds": [0, 1]}, repo)
    assert other["label"] == "exploratory" and "not the registered [200, 201]" in other["lines"][0]


def test_write_study_prints_the_commit_and_labels_tests(repo, monkeypatch):
    commit = _commit(repo, {f"{REGISTRATIONS}/q.yaml": REG}, "register q")
    monkeypatch.chdir(repo)
    per_seed = {s: {"Transformer": {"w64": {"auc": 0.8 + 0.01 * s, "acc": 0.5}},
                    "Diff": {"w64": {"auc": 0.9 + 0.02 * s, "acc": 0.6 - 0.01 * s}}} for s in (200, 201)}
    metrics = [Metric("AUC", "w64.auc", 100.0), Metric("acc", "w64.acc", 100.0)]
    cfg = {"study": "recall", "variants": ["standard", "diff"], "seeds": [200, 201], "registrations": ["q"]}
    res = write_study(repo / "out", cfg, "T", "i", per_seed, metrics, 1.0, control=Control("c", "w64.auc", 50.0, 100.0))
    report = Path(res["report"]).read_text(encoding="utf-8")
    assert f"Registration `q` ({REGISTRATIONS / 'q.yaml'}), added in commit {commit}: **confirmatory**" in report
    assert "- AUC: (confirmatory) Diff − Transformer" in report and "- acc: (exploratory) Diff − Transformer" in report
    saved = json.loads((repo / "out" / "results.json").read_text())
    assert saved["registration"]["label"] == "confirmatory"
    assert [r["confirmatory"] for r in saved["rows"]] == [["Diff"], []]
    plain = write_study(repo / "plain", {**cfg, "registrations": []}, "T", "i", per_seed, metrics, 1.0,
                        control=Control("c", "w64.auc", 50.0, 100.0))
    assert "Registration: unregistered: exploratory" in Path(plain["report"]).read_text(encoding="utf-8")
