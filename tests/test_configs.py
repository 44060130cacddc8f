"""diffattn.configs: the packaged recipes are found by name from any folder, paths win over names, and a bad name is
one error naming the argument and listing the packaged recipes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from diffattn.configs import CONFIG_DIR, config_names, find_config

REPO = Path(__file__).resolve().parents[1]


def test_every_recipe_is_packaged_and_named():
    names = config_names()
    for name in ("tiny/clip", "tiny/classify", "tiny/lm", "tiny/text", "tiny/retrofit", "tiny/vlm", "tiny/paligemma",
                 "demo/clip", "demo/diffclip", "demo/diffclip_star", "demo/diffclip_dagger", "studies/diffclip",
                 "studies/retrofit", "studies/dgvit", "studies/noise", "studies/paligemma", "daa_gpt2_owt",
                 "dex_gpt2_owt", "dgt_text", "dgvit_cifar10", "diff_paligemma_lora", "diffclip_b16_cc3m",
                 "diffclip_star_b16_cc3m"):
        assert name in names, name
    assert config_names("studies") == ["detection", "dgvit", "diffclip", "llava", "needles", "noise",
                                       "paligemma", "recall", "recall_ablation", "retrofit"]
    assert CONFIG_DIR == Path(__import__("diffattn").__file__).resolve().parent / "configs"


@pytest.mark.parametrize("spelling", ["tiny/clip", "tiny/clip.yaml", "configs/tiny/clip.yaml",
                                      "./configs/tiny/clip.yaml", "src/diffattn/configs/tiny/clip.yaml"])
def test_names_and_checkout_spellings_resolve_from_any_folder(tmp_path, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert find_config(spelling) == CONFIG_DIR / "tiny" / "clip.yaml"


def test_group_names_and_existing_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_config("diffclip", group="studies") == CONFIG_DIR / "studies" / "diffclip.yaml"
    assert find_config("studies/diffclip", group="studies") == CONFIG_DIR / "studies" / "diffclip.yaml"
    # a file of the working directory wins over a packaged recipe of the same spelling
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "clip.yaml").write_text("task: {name: classify}\n")
    assert find_config("tiny/clip.yaml") == Path("tiny/clip.yaml")
    assert find_config("tiny/clip") == CONFIG_DIR / "tiny" / "clip.yaml"  # a name, not a file


@pytest.mark.parametrize("bad", ["tiny/nope", "../pyproject", "nope.yaml", "", "tiny"])
def test_unknown_names_are_one_error_naming_the_argument(tmp_path, monkeypatch, bad):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^config must be a YAML file or the name of a packaged recipe, "
                                                r"got .*tiny/clip"):
        find_config(bad)


def test_checkout_configs_link_points_at_the_packaged_recipes():
    link = REPO / "configs"
    if not link.exists():
        pytest.skip("not a source checkout")
    assert link.resolve() == CONFIG_DIR
    assert (link / "tiny" / "clip.yaml").read_text() == (CONFIG_DIR / "tiny" / "clip.yaml").read_text()


def test_train_and_study_loaders_take_names(tmp_path, monkeypatch):
    pytest.importorskip("yaml")
    from diffattn.studies.config import find_config as find_study
    from diffattn.train import load_config

    monkeypatch.chdir(tmp_path)
    cfg = load_config("tiny/classify", ["run.steps=2"])
    assert cfg.model.name == "diff_vit_nano" and cfg.run.steps == 2
    assert find_study("retrofit") == CONFIG_DIR / "studies" / "retrofit.yaml"
    with pytest.raises(ValueError, match=r"config file 'tiny/nope' does not exist and is not a packaged recipe"):
        load_config("tiny/nope")
    with pytest.raises(FileNotFoundError, match=r"config must be a study YAML file or the name of a packaged study"):
        find_study("nope")


def test_wheel_package_data_lists_every_recipe_folder():
    """pyproject's package-data globs cover every folder that holds a recipe (a new folder needs a new glob)."""
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import fnmatch

    import tomllib

    pyproject = REPO / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("not a source checkout")
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["diffattn.configs"]
    for path in CONFIG_DIR.rglob("*.yaml"):
        rel = path.relative_to(CONFIG_DIR).as_posix()
        assert any(fnmatch.fnmatch(rel, g) and rel.count("/") == g.count("/") for g in globs), rel
