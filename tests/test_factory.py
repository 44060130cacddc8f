"""diffattn.factory: create_model / from_pretrained above the registry (which only builds) and the converters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import diffattn
import diffattn.factory as factory
from diffattn.models import registry

SRC = Path(__file__).resolve().parents[1] / "src"


def test_public_locations_are_the_factory():
    assert diffattn.create_model is diffattn.models.create_model is factory.create_model
    assert diffattn.from_pretrained is diffattn.models.from_pretrained is factory.from_pretrained
    assert diffattn.models.load_diffclip is diffattn.convert.load_diffclip


def test_importing_the_models_needs_neither_the_factory_nor_the_converters():
    """The registry builds every family without diffattn.factory or diffattn.convert being imported: neither is
    in sys.modules after importing the models and building one."""
    code = ("import json, sys; import diffattn.models as M; m = M.registry.build('vit_nano');"
            "print(json.dumps([m.model_name, len(M.list_models()), 'diffattn.factory' in sys.modules,"
            " 'diffattn.convert' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    name, count, has_factory, has_convert = json.loads(out.stdout)
    assert name == "vit_nano" and count == len(diffattn.models.list_models())
    assert (has_factory, has_convert) == (False, False)


def test_registry_build_and_factory_build_the_same_model():
    torch.manual_seed(0)
    built = registry.build("diff_vit_nano", num_classes=3)
    torch.manual_seed(0)
    made = factory.create_model("diff_vit_nano", num_classes=3)
    assert built.model_name == made.model_name == "diff_vit_nano"
    a, b = built.state_dict(), made.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert a["head.weight"].shape == (3, 64)


def test_registry_builders_leave_weights_to_the_factory():
    with pytest.raises(ValueError, match=r"pretrained='cc12m': the registry builds 'clip_tiny' without weights; "
                                         r"diffattn.create_model\('clip_tiny', pretrained=...\) loads them"):
        registry.model_builder("clip_tiny")(pretrained="cc12m")
    model = registry.model_builder("vit_nano")(pretrained=False, pretrained_cfg=None, cache_dir="x")  # timm's kwargs
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in registry.build("vit_nano").parameters())


def test_features_are_a_family_hook():
    pytest.importorskip("timm")
    vit_family, clip_family = registry.model_family("vit_nano"), registry.model_family("clip_tiny")
    assert vit_family.features is diffattn.models.vit.feature_extractor
    assert vit_family.feature_kwargs == diffattn.models.vit.FEATURE_KWARGS
    assert clip_family.features is None and clip_family.feature_kwargs == ()
    fm = factory.create_model("vit_nano", features_only=True, out_indices=[-1])
    with torch.no_grad():
        feats = fm(torch.zeros(1, 3, 32, 32))
    assert [f.shape for f in feats] == [(1, 64, 8, 8)] and fm.model_name == "vit_nano"
    with pytest.raises(ValueError, match="features_only=True needs a vision transformer, got CLIP"):
        factory.create_model("clip_tiny", features_only=True)
    with pytest.raises(ValueError, match="unknown model 'no_such_model'"):
        registry.model_family("no_such_model")


def test_from_pretrained_round_trip(tmp_path):
    torch.manual_seed(0)
    model = factory.create_model("diff_vit_nano").eval()
    model.save_pretrained(tmp_path / "m")
    loaded = factory.from_pretrained(tmp_path / "m").eval()
    assert type(loaded) is type(model) and loaded.model_name == model.model_name
    a, b = model.state_dict(), loaded.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))


def test_no_loader_sends_a_local_looking_path_to_the_hub(tmp_path, monkeypatch, capsys):
    """``runs/diffclip_tiyn`` beside ``runs/diffclip_tiny``: every loader and command says at once, in one line, that
    the folder does not exist and names the close one; nothing asks the Hub (whose five retries took 27 s
    offline)."""
    import huggingface_hub

    from diffattn import cli
    from diffattn.adapters import from_pretrained_retrofit
    from diffattn.eval.text_models import get_text_tokenizer, load_language_model
    from diffattn.models import CausalLM
    from diffattn.models.base import from_pretrained as load_saved

    def hub(*args, **kwargs):
        raise AssertionError(f"the Hub was asked: {args}")

    for name in ("snapshot_download", "hf_hub_download"):
        monkeypatch.setattr(huggingface_hub, name, hub)
    monkeypatch.setattr("diffattn.io.hub_reachable", hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "diffclip_tiny").mkdir(parents=True)
    typo, want = "runs/diffclip_tiyn", "'runs/diffclip_tiyn' does not exist; did you mean 'runs/diffclip_tiny'?"
    loaders = {"from_pretrained": factory.from_pretrained, "load_run": factory.load_run, "models.base": load_saved,
               "CausalLM.from_pretrained": CausalLM.from_pretrained,
               "create_model": lambda p: factory.create_model("diff_vit_nano", pretrained=p),
               "resolve_source": factory.resolve_source, "get_text_tokenizer": get_text_tokenizer,
               "load_language_model": lambda p: load_language_model(p),
               "base of load_language_model": lambda p: load_language_model(base=p),
               "from_pretrained_retrofit": from_pretrained_retrofit}
    for name, load in loaders.items():
        with pytest.raises(FileNotFoundError) as e:
            load(typo)
        assert want in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
    for argv in (["eval", typo], ["inspect", typo, "--ids", "1,2", "--needle-ids", "3", "--out", "o"],
                 ["train", "tiny/finetune", "--set", f"model.pretrained={typo}", "--out", "r"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("diffattn: error:") and err.count("\n") == 1 and want in err, (argv, err)
