"""``diffattn inspect`` on a saved Stable Audio 3 DiT (diffattn.eval.inspection_stable_audio): a tiny random
``StableAudio3DiTModel`` saved with ``save_pretrained``, inspected through the CLI offline; its summary and maps are
those of ``capture_stable_audio_maps`` on the same input, the noise numbers those computed here by hand."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("diffusers", reason="diffusers >= 0.40 (pip install 'diffattn[audio]') runs the Stable Audio 3 DiT")
from diffusers import StableAudio3DiTModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from diffattn.adapters.diffusers import capture_stable_audio_maps  # noqa: E402
from diffattn.cli import main  # noqa: E402
from diffattn.eval.inspection_stable_audio import stable_audio_folder, stable_audio_inputs  # noqa: E402

from .test_adapters_diffusers import _dit  # noqa: E402

#: the input the CLI runs in the tests: 10 latent frames (+ the DiT's 3 memory tokens), 7 context tokens
INPUT = ["--frames", "10", "--context-tokens", "7", "--timestep", "0.25", "--seed", "3"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("sa3") / "dit"
    _dit(torch.float64).save_pretrained(path)  # float64 safetensors: --dtype auto inspects in float64
    return path


def _reference(folder):
    """The maps of capture_stable_audio_maps on the input INPUT describes, per module name."""
    model = StableAudio3DiTModel.from_pretrained(str(folder), local_files_only=True, torch_dtype=torch.float64)
    inputs = stable_audio_inputs(model.config, frames=10, context_tokens=7, timestep=0.25, seed=3,
                                 dtype=torch.float64)
    with torch.no_grad(), capture_stable_audio_maps(model) as maps:
        model(**inputs)
    return {name: w for name, (w,) in maps.items()}


def _mean_rows(t: torch.Tensor) -> list[float]:
    return t.mean(dim=(0, 2)).tolist()


def test_inspect_runs_on_a_saved_dit_and_its_numbers_are_the_captured_maps(folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["inspect", str(folder), "--out", str(out), "--save-maps", *INPUT]) == 0
    printed = capsys.readouterr().out
    assert "negative mass" in printed and "transformer_blocks.1.cross_attn" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["family"] == "stable_audio" and summary["model_class"] == "StableAudio3DiTModel"
    assert summary["dtype"] == "float64"
    assert summary["input"] == {"batch": 1, "frames": 10, "latent_tokens": 10, "memory_tokens": 3,
                                "context_tokens": 7, "timestep": 0.25, "seed": 3, "backend": "auto"}
    assert summary["output"]["finite"] and summary["output"]["abs_mean"] > 0.1
    ref = _reference(folder)
    maps = load_file(str(out / "maps.safetensors"))
    assert [r["name"] for r in summary["layers"]] == list(ref) == [
        "transformer_blocks.0.self_attn", "transformer_blocks.0.cross_attn",
        "transformer_blocks.1.self_attn", "transformer_blocks.1.cross_attn"]
    for row in summary["layers"]:
        w = ref[row["name"]]
        a1, a2, c = (t.double() for t in w)
        self_attn = row["attention"] == "self"
        nk = 13 if self_attn else 7  # 3 memory tokens + 10 latents; 7 context tokens
        assert (row["heads"], row["queries"], row["keys"]) == (4, 13, nk)
        assert row["lambda"] == [1.0] * 4 and row["block"] == int(row["name"].split(".")[1])
        # the saved maps are the captured ones (float32), every head
        for key, t in zip(("A1", "A2", "combined"), w):
            assert maps[f"{row['name']}.{key}"].shape == (1, 4, 13, nk)
            assert (maps[f"{row['name']}.{key}"] - t.float()).abs().max().item() <= 1e-7
        # the numbers, by hand from the captured maps
        ent = [-(a * a.log()).sum(-1) for a in (a1, a2)]
        assert row["entropy"]["A1"] == pytest.approx(_mean_rows(ent[0]), abs=1e-6)
        assert row["entropy"]["A2"] == pytest.approx(_mean_rows(ent[1]), abs=1e-6)
        assert row["entropy"]["uniform"] == pytest.approx(math.log(nk))
        neg = _mean_rows(torch.where(c < 0, -c, 0.0).sum(-1))
        assert row["negative_mass"] == pytest.approx(neg, abs=1e-12)
        # rows of A1 − A2 sum to 0: the negative mass is half the L1 distance of the rows of A1 and A2
        assert row["negative_mass"] == pytest.approx(_mean_rows((a1 - a2).abs().sum(-1) / 2), abs=1e-12)
        assert 0 < min(row["negative_mass"]) and max(row["negative_mass"]) < 1
        for key, a in (("A1", a1), ("A2", a2), ("signed", c)):
            col = a[0].mean(dim=1)  # (heads, keys): the mean attention each key receives
            assert row["sink"][key]["key"] == col.argmax(-1).tolist()
            assert row["sink"][key]["mass"] == pytest.approx(col.max(-1).values.tolist(), abs=1e-12)
        if self_attn:
            for key, a in (("A1", a1), ("A2", a2), ("signed", c)):
                assert row["memory_mass"][key] == pytest.approx(_mean_rows(a[..., :3].sum(-1)), abs=1e-12)
                diag = [float(a[0, h].diagonal().mean()) for h in range(4)]
                assert row["diagonal_mass"][key] == pytest.approx(diag, abs=1e-12)
            assert row["memory_mass"]["signed"] == pytest.approx(
                [x - y for x, y in zip(row["memory_mass"]["A1"], row["memory_mass"]["A2"])], abs=1e-12)
        else:
            assert "memory_mass" not in row and "diagonal_mass" not in row
        assert max(row["checks"].values()) < 1e-12
    self_rows = [r for r in summary["layers"] if r["attention"] == "self"]
    assert summary["overall"]["self"]["negative_mass"] == pytest.approx(
        sum(sum(r["negative_mass"]) for r in self_rows) / 8)
    files = summary["files"]
    assert files["maps"] == ["maps/block_00_self.png", "maps/block_00_cross.png", "maps/block_01_self.png",
                             "maps/block_01_cross.png"]
    for name in [files[k] for k in ("self_entropy", "cross_entropy", "self_negative_mass", "cross_negative_mass",
                                    "memory_mass")] + files["maps"]:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_a_pipeline_folder_the_defaults_and_the_dtype(folder, tmp_path, capsys):
    """A pipeline's transformer/ is found; without the input options the input is 16 latent frames, 8 context
    tokens, t = 0.5, seed 0; --dtype overrides the checkpoint's."""
    pipe = tmp_path / "pipe"
    _dit(torch.float64).save_pretrained(pipe / "transformer")
    assert stable_audio_folder(pipe) == pipe / "transformer" and stable_audio_folder(folder) == folder
    assert stable_audio_folder(tmp_path / "missing") is None
    assert main(["inspect", str(pipe), "--out", str(tmp_path / "o"), "--json", "--no-plots", "--dtype",
                 "float32", "--head", "2"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["dtype"] == "float32" and res["files"] == {"summary": "summary.json"}
    assert res["input"] == {"batch": 1, "frames": 16, "latent_tokens": 16, "memory_tokens": 3, "context_tokens": 8,
                            "timestep": 0.5, "seed": 0, "backend": "auto"}
    assert [r["queries"] for r in res["layers"]] == [19] * 4 and [r["keys"] for r in res["layers"]] == [19, 8] * 2


def test_the_input_is_deterministic_and_checked():
    cfg = {"io_channels": 8, "patch_size": 2, "cond_token_dim": 16, "global_cond_dim": 12}
    a, b = stable_audio_inputs(cfg, seed=5), stable_audio_inputs(cfg, seed=5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["hidden_states"].shape == (1, 8, 32)  # 16 latent tokens of patch 2
    assert a["encoder_hidden_states"].shape == (1, 8, 16) and a["global_hidden_states"].shape == (1, 12)
    assert a["timestep"].tolist() == [0.5]
    assert not torch.equal(a["hidden_states"], stable_audio_inputs(cfg, seed=6)["hidden_states"])
    with pytest.raises(ValueError, match="frames must be a multiple of the DiT's patch_size \\(2\\), got 7"):
        stable_audio_inputs(cfg, frames=7)
    with pytest.raises(ValueError, match="timestep must be a number in \\[0, 1\\], got 2"):
        stable_audio_inputs(cfg, timestep=2)
    with pytest.raises(ValueError, match="context_tokens must be an integer >= 1, got 0"):
        stable_audio_inputs(cfg, context_tokens=0)


def test_bad_uses_are_one_line(folder, tmp_path, capsys):
    out = str(tmp_path / "o")
    assert main(["inspect", str(folder), "--out", out, "--ids", "1,2", "--needle-ids", "3"]) == 2
    assert "takes latents, not text: drop --ids, --needle-ids" in capsys.readouterr().err
    assert main(["inspect", str(folder), "--out", out, "--head", "4"]) == 2
    assert "head must be in [0, 4), got 4" in capsys.readouterr().err
    assert main(["inspect", str(folder), "--out", out, "--timestep", "1.5"]) == 2
    assert "timestep must be a number in [0, 1], got 1.5" in capsys.readouterr().err
    plain = tmp_path / "plain"
    StableAudio3DiTModel(io_channels=4, embed_dim=32, depth=1, num_heads=2, cond_token_dim=8, global_cond_dim=8,
                         local_add_cond_dim=3, timestep_features_dim=8, num_memory_tokens=0,
                         use_differential_attention=False).save_pretrained(plain)
    assert main(["inspect", str(plain), "--out", out]) == 2
    assert "use_differential_attention=False" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "llama"}')
    assert main(["inspect", str(other), "--out", out, "--frames", "8", "--ids", "1,2", "--needle-ids", "3"]) == 2
    assert "--frames set the input of a Stable Audio 3 DiT" in capsys.readouterr().err
