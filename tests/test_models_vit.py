"""ViT / DiffViT / DGViT: every registered name at a tiny size, the attention switch, save/load, timm."""

import math

import pytest
import torch

import diffattn.models as dm
from diffattn.layers import Attention, DiffAttention, GatedDiffAttention
from diffattn.models import create_model, from_pretrained, list_models
from diffattn.models import model_config as vit_config
from diffattn.models.vit import VisionTransformer

TINY = dict(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=3)
VISION_NAMES = sorted(
    [f"{p}{size}" for p in ("vit_", "diff_vit_", "dg_vit_") for size in
     ("nano", "tiny_patch16_224", "small_patch16_224", "base_patch16_224")]
    + ["vit_cifar"] + [f"{p}cifar_{r}" for p in ("diff_vit_", "dg_vit_") for r in ("x2", "x4", "x16_3")])


def test_registry_lists_the_vision_family():
    from diffattn.models import vit

    assert sorted(vit.VIT_CONFIGS) == VISION_NAMES
    assert set(VISION_NAMES) <= set(list_models("*vit*"))


@pytest.mark.parametrize("name", VISION_NAMES)
def test_every_name_forward_backward_tiny(name):
    model = create_model(name, **TINY)
    assert isinstance(model, VisionTransformer) and model.model_name == name
    out = model(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 3)
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_named_configs_follow_the_papers():
    assert vit_config("vit_cifar") == dict(img_size=32, patch_size=4, embed_dim=256, depth=8, num_heads=8,
                                           num_classes=10, drop_rate=0.05,
                                           attention=dict(kind="standard", proj_drop=0.05))
    dg = vit_config("dg_vit_cifar_x16_3")
    assert (dg["attention"], dg["mlp"], dg["num_heads"], dg["mlp_ratio"]) == (
        dict(kind="gated", q_residual=True, proj_drop=0.05), "swiglu", 16, 16 / 3)
    assert vit_config("diff_vit_base_patch16_224") == dict(embed_dim=768, depth=12, num_heads=12,
                                                           attention=dict(kind="diff"))
    assert vit_config("diff_vit_tiny_patch16_224")["num_heads"] == 6  # 3 differential heads
    m = create_model("dg_vit_cifar_x16_3", depth=1)
    assert m.blocks[0].mlp.gate_proj.out_features == 682  # ⌊256 · 16/3 / 2⌋
    assert create_model("dg_vit_cifar_x2", depth=1).blocks[0].mlp.down_proj.in_features == 256


def test_attention_switch_changes_only_attention_modules():
    models = {a: create_model("vit_nano", attention=a) for a in ("standard", "diff", "gated")}
    keys = {a: {k: v.shape for k, v in m.state_dict().items() if ".attn." not in k}
            for a, m in models.items()}
    assert keys["standard"] == keys["diff"] == keys["gated"]
    types = {a: {type(b.attn) for b in m.blocks} for a, m in models.items()}
    assert types == {"standard": {Attention}, "diff": {DiffAttention}, "gated": {GatedDiffAttention}}
    attn = {a: {k for k in m.state_dict() if ".attn." in k} for a, m in models.items()}
    assert attn["diff"] - attn["standard"] == {f"blocks.{i}.attn.{n}" for i in range(4) for n in
                                               ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2",
                                                "diff_norm.weight")}
    assert attn["gated"] - attn["standard"] == {f"blocks.{i}.attn.{n}" for i in range(4) for n in
                                                ("gate_proj.weight", "gate_proj.bias", "diff_norm.weight")}


def test_lambda_init_ye_uses_zero_based_depth():
    m = create_model("diff_vit_nano", lambda_init="ye")
    assert [b.attn.lambda_init for b in m.blocks] == pytest.approx(
        [0.8 - 0.6 * math.exp(-0.3 * i) for i in range(4)])
    assert m.blocks[0].attn.lambda_init == pytest.approx(0.2)
    assert all(b.attn.lambda_init == 0.8 for b in create_model("diff_vit_nano").blocks)


def test_dropout_layouts_and_q_residual():
    two = create_model("dg_vit_cifar_x4", depth=1).blocks[0]
    one = create_model("dg_vit_cifar_x4", depth=1, mlp_dropouts=1).blocks[0]
    assert (two.mlp.inner_drop.p, two.mlp.drop.p) == (0.05, 0.05)
    assert (one.mlp.inner_drop.p, one.mlp.drop.p) == (0.05, 0.0)
    assert two.attn.q_residual is True
    assert create_model("diff_vit_cifar_x4", depth=1).blocks[0].mlp.drop.p == 0.05


def test_save_pretrained_round_trip_exact(tmp_path):
    model = create_model("dg_vit_cifar_x16_3", depth=2, embed_dim=48, num_heads=4, lambda_init="ye").eval()
    model.save_pretrained(tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m").eval()
    assert type(loaded) is VisionTransformer and loaded.model_name == "dg_vit_cifar_x16_3"
    sd, sd2 = model.state_dict(), loaded.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(model(x), loaded(x))
    assert loaded.blocks[1].attn.lambda_init == model.blocks[1].attn.lambda_init


def test_attention_maps_and_features():
    m = create_model("diff_vit_nano").eval()
    maps = m.attention_maps(torch.randn(1, 3, 32, 32))
    assert len(maps) == 4 and maps[0].combined.shape == (1, 2, 65, 65)
    assert m.forward_features(torch.randn(1, 3, 32, 32)).shape == (1, 65, 64)
    m.reset_classifier(0)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 64)


def test_timm_create_model():
    timm = pytest.importorskip("timm")
    dm.register_timm()
    for name in ("diff_vit_tiny_patch16_224", "dg_vit_cifar_x4", "diffattn_vit_tiny_patch16_224", "vit_nano"):
        m = timm.create_model(name, **TINY)
        assert isinstance(m, VisionTransformer) and m(torch.randn(1, 3, 16, 16)).shape == (1, 3)
    assert not isinstance(timm.create_model("vit_tiny_patch16_224", depth=1), VisionTransformer)  # timm's own
    assert "diffattn_dg_vit_base_patch16_224" in timm.list_models("diffattn_*")
    with pytest.raises(ValueError, match="pretrained=True"):
        timm.create_model("diff_vit_nano", pretrained=True)


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="mlp must be one of"):
        create_model("vit_nano", mlp="relu")
    with pytest.raises(ValueError, match="num_heads"):
        create_model("diff_vit_nano", num_heads=3, embed_dim=48)
    with pytest.raises(ValueError, match="attention kind must be one of"):
        create_model("vit_nano", attention="linear")
    with pytest.raises(ValueError, match="lambda_init"):
        create_model("diff_vit_nano", lambda_init="linear")
    with pytest.raises(ValueError, match="q_residual"):
        create_model("vit_nano", q_residual=True)
    with pytest.raises(ValueError, match=r"override 'width' is not an argument of VisionTransformer"):
        create_model("vit_nano", width=3)
    with pytest.raises(ValueError, match=r"images must have shape \(B, 3, 32, 32\), got \(1, 3, 16, 16\)"):
        create_model("vit_nano")(torch.randn(1, 3, 16, 16))
    with pytest.raises(ValueError, match="img_size must be divisible"):
        create_model("vit_nano", img_size=30)
    assert hasattr(dm, "create_model")
