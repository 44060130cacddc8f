"""Files written by diffattn 0.1.0 (tests/fixtures/v0_1_0, made by that version's own code: see
tests/fixtures/make_v0_1_0.py) load strictly and compute exactly what they computed then; files record their
diffattn format, a newer format is a clear error, and a file migrated from an older format loads without warning
once saved again."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import diffattn
from diffattn import FormatMigrationWarning
from diffattn.formats import FORMAT, FORMAT_KEY, VERSION_KEY, FormatVersionError, migrate, read_format
from diffattn.layers import DiffAttention, load_layer
from diffattn.models import VisionTransformer

FIX = Path(__file__).parent / "fixtures" / "v0_1_0"
LAYER_RECORDS = json.loads((FIX / "layers" / "layers.json").read_text())
MODEL_DIRS = ["diff_vit_nano", "dg_vit_nano"] + [f"models/{p.name}" for p in sorted((FIX / "models").iterdir())]
ADAPTERS = [("gpt2_daa/adapter", "gpt2_daa", "y"), ("gpt2_daa/adapter_shared_qk", "gpt2_daa", "y_shared_qk")] + [
    (f"gpt2_methods/{m}", "gpt2_methods", m) for m in ("dex", "diffq", "diffk", "diffv", "split_heads")]
# the 0.1.0 token_sigmoid λ was σ(X W + b); its default is now σ(X W) (Diff Transformer V2), so these migrate
MIGRATED_LAYERS = {"diff_token_sigmoid", "diff_token_sigmoid_sub_norm"}
#: The float32 outputs 0.1.0 recorded, compared with today's on this machine: equal up to reassociation, not bit
#: for bit. Another CPU's kernels (AVX-512 against AVX2), another thread count and today's op order (the sub-norm's
#: scale folded into its weight, w1·O1 − λ·O2 in one addcmul) each round differently: up to 2 float32 ulps here
#: (9.5e-7 on outputs of magnitude 4, 8e-7 after the layers of a causal LM). 1e-5 relative plus 3e-6 absolute
#: leaves a wide margin above that; a changed meaning is far outside it (the λ bias of token_sigmoid dropped:
#: 0.23; its sub-norm lost: 2.4).
RECORDED_F32 = {"rtol": 1e-5, "atol": 3e-6}


def _io(path: Path) -> dict:
    return torch.load(path / "io.pt", weights_only=True)


@contextlib.contextmanager
def _no_migration():
    """A FormatMigrationWarning inside fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FormatMigrationWarning)
        yield


def _model_outputs(model, io: dict) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        if "images" in io:  # CLIP
            return {"image_features": model.encode_image(io["images"]),
                    "text_features": model.encode_text(io["tokens"])}
        return {"y": model(io["x"] if "x" in io else io["ids"])}


# ------------------------------------------------------------------------------------ 0.1.0 files, exactly


@pytest.mark.parametrize("name", MODEL_DIRS)
def test_models_saved_by_0_1_0_load_exactly(name):
    """Every family and attention kind of 0.1.0 (ViT, CLIP/DiffCLIP/DiffCLIP*/DiffCLIP†/gated CLIP, T/DT/DGT,
    standard/diff/gated causal LMs): no meaning changed, so no migration warning."""
    with _no_migration():
        model = diffattn.from_pretrained(FIX / name).eval()
    io = _io(FIX / name)
    for key, y in _model_outputs(model, io).items():
        torch.testing.assert_close(y, io[key], **RECORDED_F32, msg=f"{name}: {key}")


@pytest.mark.parametrize("name", sorted(LAYER_RECORDS))
def test_layers_saved_by_0_1_0_load_exactly(name):
    """Every λ form and layer kind of 0.1.0, saved as 0.1.0 saved layers (the state dict; the caller keeps the
    constructor arguments), loads strictly through load_layer and computes what it computed."""
    rec = LAYER_RECORDS[name]
    sd = load_file(str(FIX / "layers" / f"{name}.safetensors"))
    if name in MIGRATED_LAYERS:
        with pytest.warns(FormatMigrationWarning, match=r"σ\(X W \+ b\).*lambda_options=\{'bias': True\}"):
            layer = load_layer(rec["attention"], rec["kwargs"], sd, diffattn_format=0)
    else:
        with _no_migration():
            layer = load_layer(rec["attention"], rec["kwargs"], sd, diffattn_format=0)
    assert set(layer.state_dict()) == set(sd)  # strict: the layer holds exactly the saved tensors
    io = _io(FIX / "layers")[name]
    with torch.no_grad():
        y = layer.eval()(io["x"])
    torch.testing.assert_close(y, io["y"], **RECORDED_F32)


def test_token_sigmoid_of_0_1_0_keeps_its_bias_and_has_no_sub_norm():
    """0.1.0's DiffAttention(lambda_form="token_sigmoid") is σ(X W + b) without sub-norm: the migration turns on
    the bias only; with the bias set to 0 it computes exactly the default (documented) form."""
    rec = LAYER_RECORDS["diff_token_sigmoid"]
    sd = load_file(str(FIX / "layers" / "diff_token_sigmoid.safetensors"))
    with pytest.warns(FormatMigrationWarning):
        old = load_layer(rec["attention"], rec["kwargs"], sd, diffattn_format=0).eval()
    assert isinstance(old.diff_norm, torch.nn.Identity) and old.out_scale == 1.0
    assert old.lambda_fn.lambda_proj.bias is not None
    default = DiffAttention(16, 4, lambda_form="token_sigmoid").eval()
    assert isinstance(default.diff_norm, torch.nn.Identity) and default.lambda_fn.lambda_proj.bias is None
    default.load_state_dict({k: v for k, v in sd.items() if k != "lambda_fn.lambda_proj.bias"})
    with torch.no_grad():
        old.lambda_fn.lambda_proj.bias.zero_()
        x = _io(FIX / "layers")["diff_token_sigmoid"]["x"]
        torch.testing.assert_close(default(x), old(x), rtol=0, atol=0)
    # built by hand without the bias option, a strict load names the way to load it
    with pytest.raises(RuntimeError, match=r"lambda_options=\{'bias': True\}"):
        DiffAttention(16, 4, lambda_form="token_sigmoid").load_state_dict(sd)


@pytest.mark.parametrize("adapter,io_dir,key", ADAPTERS)
def test_adapters_saved_by_0_1_0_load_exactly(adapter, io_dir, key):
    io = _io(FIX / io_dir)
    with _no_migration():
        model = diffattn.load_adapter(_gpt2_base(), FIX / adapter).eval()
    with torch.no_grad():
        y = model(io["ids"]).logits
    torch.testing.assert_close(y, io[key], **RECORDED_F32, msg=adapter)


def _gpt2_base():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config.from_json_file(str(FIX / "gpt2_daa" / "base" / "config.json"))
    model = GPT2LMHeadModel(cfg).eval()
    missing, unexpected = model.load_state_dict(load_file(str(FIX / "gpt2_daa" / "base" / "model.safetensors")),
                                                strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # tied to wte
    return model


# ----------------------------------------------------------------------------------------- format records


def _tiny_vit(**kw) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(img_size=8, patch_size=4, num_classes=3, embed_dim=16, depth=2, num_heads=4,
                             attention="diff", **kw).eval()


def test_saves_record_the_format(tmp_path):
    _tiny_vit().save_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg[FORMAT_KEY] == FORMAT and cfg[VERSION_KEY] == diffattn.__version__
    model = diffattn.retrofit(_gpt2_base(), "dex", anneal_steps=10)
    diffattn.save_adapter(model, tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "diffattn_adapter.json").read_text())
    assert meta[FORMAT_KEY] == FORMAT and meta[VERSION_KEY] == diffattn.__version__
    assert read_format(meta, "x") == FORMAT and read_format({}, "x") == 0


def test_a_newer_format_is_a_clear_error(tmp_path):
    _tiny_vit().save_pretrained(tmp_path / "m")
    cfg_file = tmp_path / "m" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.update({FORMAT_KEY: FORMAT + 1, VERSION_KEY: "9.0.0", "option_of_the_future": 1})
    cfg_file.write_text(json.dumps(cfg))
    msg = rf"config.json was written by diffattn 9.0.0 in diffattn format {FORMAT + 1}; this diffattn reads " \
          rf"formats 0 to {FORMAT}"
    with pytest.raises(FormatVersionError, match=msg):
        diffattn.from_pretrained(tmp_path / "m")
    with pytest.raises(FormatVersionError, match=msg):
        VisionTransformer.from_pretrained(tmp_path / "m")

    model = diffattn.retrofit(_gpt2_base(), "dex", anneal_steps=10)
    diffattn.save_adapter(model, tmp_path / "a")
    meta_file = tmp_path / "a" / "diffattn_adapter.json"
    meta = json.loads(meta_file.read_text())
    meta.update({FORMAT_KEY: FORMAT + 1, "field_of_the_future": 1})
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(FormatVersionError, match=rf"diffattn_adapter.json was written by diffattn "
                                                 rf"{diffattn.__version__} in diffattn format {FORMAT + 1}"):
        diffattn.load_adapter(_gpt2_base(), tmp_path / "a")

    sd = DiffAttention(16, 4).state_dict()
    with pytest.raises(FormatVersionError, match=f"format {FORMAT + 1}"):
        load_layer("diff", {"dim": 16, "num_heads": 4}, sd, diffattn_format=FORMAT + 1)
    for bad in (-1, "1", 1.0, True):
        with pytest.raises(ValueError, match=FORMAT_KEY):
            read_format({FORMAT_KEY: bad}, "x")


# ------------------------------------------------------------------------ migration of the code after 0.1.0


def _strip_to_format_0(directory: Path, drop=("sub_norm",)) -> None:
    """config.json as the code between 0.1.0 and format 1 wrote it: no format entries, no ``sub_norm`` option
    (its token_sigmoid layers had the sub-norm by default)."""
    cfg_file = directory / "config.json"
    cfg = json.loads(cfg_file.read_text())
    for c in [cfg] + [v for v in cfg.values() if isinstance(v, dict)]:
        if isinstance(c.get("attention"), dict):  # that code wrote the attention settings as loose keys
            att = c.pop("attention")
            c.update(attention=att["kind"], lambda_init=att.get("lambda_init", 0.8),
                     lambda_form=att.get("lambda_form"), sub_norm=att.get("sub_norm"), qkv_bias=att["qkv_bias"])
        for k in (FORMAT_KEY, VERSION_KEY, *drop):
            c.pop(k, None)
    cfg_file.write_text(json.dumps(cfg))


def _tiny_clip():
    from diffattn.models import CLIP

    torch.manual_seed(0)
    tower = dict(embed_dim=16, depth=1, num_heads=4)
    return CLIP(embed_dim=8, vision=dict(img_size=8, patch_size=4, attention="diff", lambda_form="token_sigmoid",
                                         sub_norm=True, **tower),
                text=dict(vocab_size=32, context_length=8, attention="standard", **tower)).eval()


@pytest.mark.parametrize("make", ["vit", "clip"])
def test_token_sigmoid_model_of_format_0_is_migrated_and_resaved_without_warning(tmp_path, make):
    """A model saved with lambda_form="token_sigmoid" by the code before format 1 had the sub-norm: it loads with
    sub_norm=True and a FormatMigrationWarning, computes what it computed, and once saved again loads silently."""
    model = _tiny_vit(lambda_form="token_sigmoid", sub_norm=True) if make == "vit" else _tiny_clip()
    tokens = torch.tensor([[3, 4, 5, 31, 0, 0, 0, 0], [1, 2, 31, 0, 0, 0, 0, 0]])  # EOT = 31, the largest id
    io = {"x": torch.randn(2, 3, 8, 8)} if make == "vit" else {"images": torch.randn(2, 3, 8, 8), "tokens": tokens}
    expect = _model_outputs(model, io)
    model.save_pretrained(tmp_path / "old")
    _strip_to_format_0(tmp_path / "old")
    with pytest.raises(ValueError, match="unexpected.*diff_norm"):  # today's defaults do not fit the checkpoint
        _strict_without_migration(tmp_path / "old")
    where = "vision: " if make == "clip" else ""
    with pytest.warns(FormatMigrationWarning, match=rf"format 0.*{where}token_sigmoid attention keeps the RMSNorm"):
        loaded = diffattn.from_pretrained(tmp_path / "old").eval()
    for key, y in _model_outputs(loaded, io).items():
        torch.testing.assert_close(y, expect[key], rtol=0, atol=0)
    loaded.save_pretrained(tmp_path / "new")
    cfg = json.loads((tmp_path / "new" / "config.json").read_text())
    assert cfg[FORMAT_KEY] == FORMAT and (cfg if make == "vit" else cfg["vision"])["attention"]["sub_norm"] is True
    with _no_migration():
        again = diffattn.from_pretrained(tmp_path / "new").eval()
    for key, y in _model_outputs(again, io).items():
        torch.testing.assert_close(y, expect[key], rtol=0, atol=0)


def _strict_without_migration(directory: Path):
    """Build the model from the stripped config with today's defaults and load its weights strictly."""
    from diffattn.models.base import _read_weights, load_state_dict_exact, model_class

    cfg = json.loads((directory / "config.json").read_text())
    cls = model_class(cfg.pop("architecture"))
    cfg.pop("model_name", None)
    return load_state_dict_exact(cls(**cfg), _read_weights(str(directory / "model.safetensors"), "x"), "x")


def test_token_sigmoid_layer_of_format_0_with_sub_norm_is_migrated():
    """A layer state dict of the code before format 1 (token_sigmoid with the sub-norm, no bias) loads with
    sub_norm=True; the arguments the warning names load it at the current format without a warning."""
    torch.manual_seed(0)
    layer = DiffAttention(16, 4, lambda_form="token_sigmoid", sub_norm=True).eval()
    sd, x = layer.state_dict(), torch.randn(2, 5, 16)
    with pytest.warns(FormatMigrationWarning, match=r"sub_norm=True") as record:
        loaded = load_layer("diff", {"dim": 16, "num_heads": 4, "lambda_form": "token_sigmoid"}, sd,
                            diffattn_format=0)
    assert len(record) == 1 and "bias" not in str(record[0].message)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), layer(x), rtol=0, atol=0)
    with _no_migration():
        again = load_layer("diff", {"dim": 16, "num_heads": 4, "lambda_form": "token_sigmoid", "sub_norm": True},
                           sd, diffattn_format=FORMAT)
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x), layer(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="unexpected|Unexpected"):  # strict: today's default has no sub-norm
        load_layer("diff", {"dim": 16, "num_heads": 4, "lambda_form": "token_sigmoid"}, sd, diffattn_format=FORMAT)


def test_migrate_copies_and_leaves_current_files_alone():
    cfg = {"attention": "diff", "lambda_form": "token_sigmoid", "dim": 16, "num_heads": 4}
    sd = {"lambda_fn.lambda_proj.bias": torch.zeros(2)}
    with pytest.warns(FormatMigrationWarning):
        new_cfg, new_sd = migrate("layer", cfg, sd, source=0, what="x")
    assert new_cfg["lambda_options"] == {"bias": True} and "lambda_options" not in cfg  # a copy
    assert new_sd.keys() == sd.keys()
    with _no_migration():
        same_cfg, _ = migrate("layer", cfg, sd, source=FORMAT, what="x")
    assert same_cfg == cfg
    with pytest.raises(ValueError, match="kind"):
        migrate("tensor", cfg, sd, source=0, what="x")
    # a token_sigmoid state dict without norm weight cannot tell whether it had a weightless sub-norm: it warns
    cfg = {"attention": "diff", "lambda_form": "token_sigmoid", "dim": 16, "num_heads": 4, "sub_norm_affine": False}
    with pytest.warns(FormatMigrationWarning, match="pass sub_norm=True if"):
        new_cfg, _ = migrate("layer", cfg, {}, source=0, what="x")
    assert "sub_norm" not in new_cfg
    # 0.1.0's DiffAttention(lambda_std=...) set only the reparam init: it becomes the λ option, silently
    with _no_migration():
        old = {"attention": "diff", "dim": 16, "num_heads": 4, "lambda_std": 0.05}
        new, _ = migrate("layer", old, DiffAttention(16, 4).state_dict(), source=0, what="x")
    assert new == {"attention": "diff", "dim": 16, "num_heads": 4, "lambda_options": {"std": 0.05}}
