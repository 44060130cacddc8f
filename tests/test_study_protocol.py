"""The study protocol (diffattn.studies.base): a new study is one class plus its YAML, registered from this test
module and run tiny end to end; the shared MQAR stream gives the batches the three hand-written copies gave."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest
import torch
import yaml

from diffattn.data.synthetic import SyntheticVocab, mqar_batch
from diffattn.studies import Study, get_study, load_study, register_study, run_study, study_names, validate_study
from diffattn.studies.base import StudyConfig
from diffattn.studies.common import mqar_stream
from diffattn.studies.report import Control, Metric, run_seeds, write_study

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "src" / "diffattn" / "studies"


def _old_mqar_stream(pairs, batch_size, vocab, seed):
    """The generator as it was written three times before (studies.recall._train_batches, the MQAR branch of
    studies.needles._train_batches, scripts/recall_crosscheck_hf.stream)."""
    g = torch.Generator().manual_seed(seed)
    while True:
        p = pairs[int(torch.randint(len(pairs), (1,), generator=g))]
        yield mqar_batch(batch_size, pairs=p, generator=g, vocab=vocab)


@pytest.mark.parametrize("seed", [0, 7])
def test_mqar_stream_gives_the_old_batches(seed):
    from diffattn.studies import needles, recall

    vocab = SyntheticVocab(num_keys=16, num_values=16, num_filler=8)
    pairs = [2, 4, 8]
    streams = [mqar_stream(pairs, 5, vocab, seed),
               recall._train_batches({"pairs": pairs, "batch_size": 5}, vocab, seed),
               needles._train_batches({"train_task": "mqar", "train_pairs": pairs, "batch_size": 5}, vocab, seed)]
    old = _old_mqar_stream(pairs, 5, vocab, seed)
    for _ in range(12):
        ref = next(old)
        for s in streams:
            b = next(s)
            for field in ("ids", "answer_pos", "answers", "answer_span"):
                assert torch.equal(getattr(b, field), getattr(ref, field))
            assert b.context == ref.context


def test_the_crosscheck_script_uses_the_shared_stream():
    tree = ast.parse((ROOT / "scripts" / "recall_crosscheck_hf.py").read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "stream"]
    assert "mqar_stream" in {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}


class CountingStudy(Study):
    """A study defined in a test: each variant's 'accuracy' is its offset plus a seed-dependent draw."""

    name = "counting_test"
    variants = {"low": "Low", "high": "High"}
    defaults = {"offset": 0.5, "draws": 3}

    def check(self, cfg, where):
        return [] if cfg.draws >= 1 else [f"draws in {where} must be >= 1, got {cfg.draws}"]

    def control(self, cfg):
        return Control("Low accuracy", "accuracy", 0.0)

    def run(self, cfg, progress=True):
        def one_seed(seed, folder):
            g = torch.Generator().manual_seed(seed)
            return {self.label(v): {"accuracy": float(torch.rand(cfg.draws, generator=g).mean())
                                    + (cfg.offset if v == "high" else 0.0)} for v in cfg.variants}

        return run_seeds(cfg, one_seed)

    def report(self, cfg, per_seed, seconds):
        return write_study(cfg.out, cfg, "Study: counting", "A test study.", per_seed,
                           [Metric("accuracy", "accuracy", 1.0, 3)], seconds, control=self.control(cfg))


@pytest.fixture
def counting():
    from diffattn.studies import base

    register_study(CountingStudy)
    yield
    base._REGISTRY.pop("counting_test", None)


def test_a_study_registered_from_a_test_module_runs(tmp_path, counting):
    assert isinstance(get_study("counting_test"), CountingStudy) and "counting_test" in study_names()
    path = tmp_path / "counting.yaml"
    path.write_text(yaml.safe_dump({"study": "counting_test", "seeds": [0, 1], "out": str(tmp_path / "out"),
                                    "draws": 2}))
    cfg = load_study(path)
    assert isinstance(cfg, StudyConfig) and cfg.draws == 2 and cfg["offset"] == 0.5 and cfg.variants == ["low", "high"]
    res = run_study(path, progress=False)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["labels"] == ["Low", "High"] and results["control_status"] == "passed" and res["rows"]
    assert results["config"] == {"study": "counting_test", "variants": ["low", "high"], "seeds": [0, 1],
                                 "out": str(tmp_path / "out"), "control_set": "", "exclude_failed_seeds": False,
                                 "registrations": [], "offset": 0.5, "draws": 2}
    with pytest.raises(ValueError, match="draws in the study config must be >= 1, got 0"):
        validate_study({"study": "counting_test", "seeds": [0, 1], "draws": 0})
    with pytest.raises(ValueError, match="offset in the study config must be of type float"):
        validate_study({"study": "counting_test", "seeds": [0, 1], "offset": "x"})


def test_every_packaged_study_is_a_registered_study():
    for name in study_names():
        cfg = load_study(name)
        study = get_study(name)
        assert isinstance(study, Study) and study.name == name and isinstance(cfg, StudyConfig)
        controls = study.control(cfg)
        assert all(isinstance(c, Control) for c in (controls if isinstance(controls, list) else [controls]))


def test_no_branch_on_study_names_outside_the_registry():
    """Code never switches on a study's name (``if name == "recall"``): the registry looks it up."""
    names = {p.stem for p in (ROOT / "src" / "diffattn" / "configs" / "studies").glob("*.yaml")}
    bad = []
    for path in [*STUDIES.glob("*.py"), *(ROOT / "src" / "diffattn" / "cli").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            sides = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
            if any(isinstance(c, ast.Constant) and c.value in names for c in sides) and \
                    any("study" in ast.unparse(c) or "name" in ast.unparse(c) for c in sides):
                bad.append(f"{path.name}:{node.lineno}")
    assert not bad, bad


def test_studies_read_no_module_attribute_by_getattr_and_no_private_data_module():
    for path in STUDIES.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "getattr(module" not in text, path.name
        assert "data._common" not in text, path.name


def test_every_packaged_study_is_a_class_of_its_own_module():
    """One spelling: each packaged study is a ``Study`` subclass written in ``diffattn.studies.<name>``."""
    for name in study_names():
        cls = type(get_study(name))
        assert cls is not Study and cls.__module__ == f"diffattn.studies.{name}", (name, cls)
        assert cls.__dict__.get("name") == name and ("run" in vars(cls) or "execute" in vars(cls)), name


def test_no_study_imports_another_modules_private_names():
    """What two studies share lives in ``diffattn.studies.common`` (public, with an ``__all__``): no module of the
    package imports a ``_private`` name from another of its modules."""
    bad = []
    for path in STUDIES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                bad += [f"{path.name}: from .{node.module} import {a.name}" for a in node.names
                        if a.name.startswith("_")]
    assert not bad, bad
    from diffattn.studies import common

    assert all(hasattr(common, n) for n in common.__all__)


@pytest.mark.parametrize("old, module, name, new", [
    ("diffattn.studies.STUDY_MODULES", "diffattn.studies", "STUDY_MODULES", None),
    ("diffattn.studies.config.STUDY_MODULES", "diffattn.studies.config", "STUDY_MODULES", None),
    ("diffattn.studies.base.mqar_stream", "diffattn.studies.base", "mqar_stream", "diffattn.studies.common"),
    ("diffattn.studies.base.require_datasets", "diffattn.studies.base", "require_datasets", "diffattn.studies.common"),
    ("diffattn.studies.base.higher_is_better", "diffattn.studies.base", "higher_is_better", "diffattn.directions"),
    ("diffattn.studies.base.apply_sets", "diffattn.studies.base", "apply_sets", "diffattn.configs"),
])
def test_the_moved_study_names_warn_and_resolve(old, module, name, new):
    import importlib

    from diffattn.deprecations import DEPRECATIONS

    assert DEPRECATIONS[old].removed_in == "0.3.0"
    with pytest.warns(FutureWarning, match=f"{old} is deprecated since diffattn 0.2.0 and removed in diffattn 0.3.0"):
        value = getattr(importlib.import_module(module), name)
    if new is None:  # the packaged studies' modules, by name
        from diffattn.configs import config_names

        assert value == {n: f"diffattn.studies.{n}" for n in config_names("studies")} and "recall" in value
    else:
        assert value is getattr(importlib.import_module(new), name)


def test_the_diffclip_entry_point_of_0_1_0_warns_and_runs_the_study(tmp_path, monkeypatch):
    """``diffattn.studies.diffclip.run(cfg)`` (documented for a single seed) is the study's ``execute``."""
    from diffattn.studies import diffclip

    calls = []
    monkeypatch.setattr(diffclip.DiffCLIPStudy, "execute", lambda self, cfg, progress=True: calls.append(cfg) or "ok")
    with pytest.warns(FutureWarning, match="diffattn.studies.diffclip.run is deprecated"):
        run = diffclip.run
    cfg = load_study("diffclip").replace(seeds=[4], out=str(tmp_path))
    assert run(cfg, progress=False) == "ok" and calls == [cfg]


#: every packaged study: name → (its class's name, its title), as they were before the class keywords
PACKAGED_STUDIES = {
    "detection": ("DetectionStudy", "Study: YOLO26 with and without differential attention"),
    "dgvit": ("DGViTStudy", "Study: ViT vs DiffViT vs DGViT under noise"),
    "diffclip": ("DiffCLIPStudy", "Study: CLIP vs DiffCLIP"),
    "llava": ("LLaVAStudy", "Study: LLaVA-style VLM, CLIP vs DiffCLIP image tower"),
    "needles": ("NeedlesStudy", "Study: multi-needle retrieval, standard vs differential attention"),
    "noise": ("NoiseStudy", "Study: attention noise, standard vs differential LM"),
    "paligemma": ("PaliGemmaStudy", "Study: Differential PaliGemma vs LoRA fine-tuning"),
    "recall": ("RecallStudy", "Study: multi-query associative recall, standard vs differential attention"),
    "recall_ablation": ("RecallAblationStudy", ""),
    "retrofit": ("RetrofitStudy", "Study: retrofitted differential attention vs plain fine-tuning"),
}


@pytest.mark.parametrize("name", sorted(PACKAGED_STUDIES))
def test_each_packaged_study_keeps_its_name_title_variants_and_defaults(name):
    module = importlib.import_module(f"diffattn.studies.{name}")
    cls_name, title = PACKAGED_STUDIES[name]
    study = get_study(name)
    assert type(study) is getattr(module, cls_name)
    assert (study.name, study.title) == (name, title)
    if name == "diffclip":
        assert study.variants == {v: label for v, (_, label) in module.DEMO_VARIANTS.items()}
    else:
        assert study.variants is module.VARIANTS
    assert study.defaults is module.DEFAULTS
    assert study.default_variants is getattr(module, "DEFAULT_VARIANTS", None)
    assert name in study_names()


def test_class_keywords_set_the_attributes_and_register_the_study():
    from diffattn.studies import base

    try:
        class KeywordStudy(Study, name="keyword_test", title="Study: keywords", variants={"a": "A", "b": "B"},
                           default_variants=["a"], defaults={"draws": 1}):
            pass

        study = get_study("keyword_test")
        assert type(study) is KeywordStudy
        assert (KeywordStudy.name, KeywordStudy.title, KeywordStudy.variants, KeywordStudy.default_variants,
                KeywordStudy.defaults) == ("keyword_test", "Study: keywords", {"a": "A", "b": "B"}, ["a"],
                                           {"draws": 1})

        class Child(KeywordStudy):  # no keywords: inherits them and registers nothing
            pass

        assert Child.name == "keyword_test" and type(get_study("keyword_test")) is KeywordStudy
        register_study(Child)  # the decorator of before still registers (and replaces)
        assert type(get_study("keyword_test")) is Child
    finally:
        base._REGISTRY.pop("keyword_test", None)


@pytest.mark.parametrize("name", sorted(PACKAGED_STUDIES))
def test_each_packaged_study_keeps_its_control(name):
    module = importlib.import_module(f"diffattn.studies.{name}")
    cfg = load_study(name)
    want = module.control(cfg) if callable(getattr(module, "control", None)) else module.CONTROL
    assert get_study(name).control(cfg) == want


def test_the_control_keyword_is_the_control_or_gives_it(tmp_path):
    fixed = Control("A accuracy", "accuracy", 0.5)

    class Fixed(Study, control=fixed):  # no name: registers nothing
        title = "Study: fixed"

    class PerConfig(Study, control=lambda cfg: [Control("A accuracy", "accuracy", cfg["threshold"])]):
        pass

    class NoControl(Study):
        name = "no_control"

    assert Fixed().control({}) is fixed and Fixed.positive_control is fixed
    assert PerConfig().control({"threshold": 0.7}) == [Control("A accuracy", "accuracy", 0.7)]
    with pytest.raises(NotImplementedError, match="study 'no_control' declares no control"):
        NoControl().control({})
    cfg = {"study": "fixed", "variants": ["a"], "seeds": [0], "out": str(tmp_path)}
    res = Fixed().write_report(cfg, "Intro.", {0: {"A": {"accuracy": 0.75}}}, [Metric("accuracy", "accuracy", 1.0, 3)],
                               1.0)
    assert res["control"]["passed"] and (tmp_path / "report.md").read_text().startswith("# Study: fixed")
