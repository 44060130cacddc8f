"""diffattn.data._common: the data directory is found the same way from any folder, in the documented order
($DIFFATTN_DATA, the source checkout's data/, the user cache), and a missing set names the command that makes it."""

from __future__ import annotations

from pathlib import Path

import pytest

import diffattn
from diffattn.data import _common
from diffattn.data import default_root as exported_default_root
from diffattn.data._common import (
    SETUP_COMMAND,
    DatasetNotInstalledError,
    data_root,
    dataset_dir,
    default_root,
    source_checkout,
    user_cache_dir,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """No DIFFATTN_DATA, a fresh HOME, no XDG_CACHE_HOME, and a working directory with a decoy ./data."""
    monkeypatch.delenv("DIFFATTN_DATA", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "cwd" / "data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def _checkout(tmp_path: Path, with_data: bool) -> Path:
    repo = tmp_path / "checkout"
    (repo / "src" / "diffattn").mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[project]\nname = "diffattn"\n')
    if with_data:
        (repo / "data").mkdir()
    return repo


def test_source_checkout_is_this_repository_or_none():
    imported_from = Path(diffattn.__file__).resolve()
    expected = REPO if imported_from.is_relative_to(REPO / "src") else None
    assert source_checkout() == expected


def test_diffattn_data_wins(clean_env, monkeypatch):
    repo = _checkout(clean_env, with_data=True)
    monkeypatch.setattr(_common, "source_checkout", lambda: repo)
    monkeypatch.setenv("DIFFATTN_DATA", str(clean_env / "mine"))
    assert data_root() == (clean_env / "mine", "DIFFATTN_DATA")
    monkeypatch.setenv("DIFFATTN_DATA", "~/d")
    assert default_root() == clean_env / "home" / "d"  # ~ expanded


def test_checkout_data_when_present_then_user_cache(clean_env, monkeypatch):
    repo = _checkout(clean_env, with_data=True)
    monkeypatch.setattr(_common, "source_checkout", lambda: repo)
    assert data_root() == (repo / "data", "checkout")
    (repo / "data").rmdir()  # a checkout without data/ uses the user cache, like an installed copy
    assert data_root() == (clean_env / "home" / ".cache" / "diffattn", "user cache")
    monkeypatch.setattr(_common, "source_checkout", lambda: None)
    assert data_root() == (clean_env / "home" / ".cache" / "diffattn", "user cache")


def test_user_cache_honours_absolute_xdg_cache_home(clean_env, monkeypatch):
    monkeypatch.setattr(_common, "source_checkout", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean_env / "xdg"))
    assert user_cache_dir() == clean_env / "xdg" / "diffattn"
    assert data_root() == (clean_env / "xdg" / "diffattn", "user cache")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # ignored, as the XDG spec says
    assert user_cache_dir() == clean_env / "home" / ".cache" / "diffattn"


def test_same_directory_from_any_working_directory(clean_env, monkeypatch):
    monkeypatch.setattr(_common, "source_checkout", lambda: None)
    here = default_root()
    monkeypatch.chdir(clean_env)
    assert default_root() == here != Path("data")  # the decoy ./data of the old default is not used
    assert exported_default_root() == here


def test_missing_set_names_the_prepare_command_and_the_folder(tmp_path):
    with pytest.raises(DatasetNotInstalledError, match=rf"`{SETUP_COMMAND} spamassassin`") as err:
        dataset_dir(tmp_path, "spam_assassin", stamp=".fetched")
    assert str(tmp_path / "spam_assassin" / ".fetched") in str(err.value) and "DIFFATTN_DATA" in str(err.value)
    (tmp_path / "emoji").mkdir()
    (tmp_path / "emoji" / ".prepared").write_text("x\n")
    assert dataset_dir(tmp_path, "emoji") == tmp_path / "emoji"
