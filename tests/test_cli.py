"""The diffattn command: the demo job trains and saves real models; models lists the registry."""

from __future__ import annotations

import json

import pytest

from diffattn import cli, from_pretrained


def test_demo_trains_on_real_digits_and_saves(tmp_path, capsys):
    pytest.importorskip("sklearn", reason="the demo's digits come with scikit-learn")
    rc = cli.main(["demo", "--epochs", "5", "--attention", "standard", "diff", "--noise", "0.5",
                   "--out", str(tmp_path)])
    assert rc == 0
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [r["attention"] for r in rows] == ["standard", "diff"]
    for r in rows:
        assert r["test_acc"] > 0.3  # 10 classes: chance is 0.1; five epochs already learn
        assert 0.0 <= r["acc_noise_0.5"] <= 1.0
    assert len(rows[1]["lambda"]) == 2  # one λ per differential block
    model = from_pretrained(tmp_path / "diff_vit_nano")
    assert model.attention == "diff"
    assert "| diff | diff_vit_nano |" in capsys.readouterr().out


def test_models_lists_registry(capsys):
    assert cli.main(["models", "diffclip*"]) == 0
    names = capsys.readouterr().out.split()
    assert "diffclip_vit_b16" in names and all(n.startswith("diffclip") for n in names)


@pytest.mark.parametrize("argv, message", [
    (["demo", "--epochs", "0"], "argument --epochs: must be >= 1, got 0"),
    (["demo", "--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    (["demo", "--batch-size", "-1"], "argument --batch-size: must be >= 1, got -1"),
    (["demo", "--lr", "nan"], "argument --lr: needs a finite number"),
    (["demo", "--lr", "0"], "argument --lr: must be > 0.0, got 0"),
    (["demo", "--epochs", "two"], "argument --epochs: needs int, got 'two'"),
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
