"""timm's model API on diffattn's vision transformers: what timm's train.py, optimizer factory, data config and
feature extraction call, each checked by its numbers."""

import copy
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import diffattn.models.vit as vit_module
from diffattn.convert import read_checkpoint
from diffattn.data import default_root
from diffattn.factory import register_timm
from diffattn.models import create_model
from diffattn.models.vit import IMAGENET_MEAN, IMAGENET_STD, VisionTransformer, take_indices

timm = pytest.importorskip("timm")
register_timm()  # diffattn's names in timm's registry (importing diffattn registers nothing)

REPO = Path(__file__).resolve().parents[1]
DATA = default_root()


def nano(name="diff_vit_nano", **kw):
    torch.manual_seed(0)
    return create_model(name, **kw)


def test_get_and_reset_classifier():
    m = nano()
    assert m.get_classifier() is m.head and m.get_classifier().out_features == 10
    m = m.double()
    m.reset_classifier(7, global_pool="avg")
    assert m.num_classes == 7 and m.global_pool == "avg"
    assert m.get_classifier().weight.dtype == torch.float64 and m.get_classifier().out_features == 7
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    tokens = m.forward_features(x)
    assert torch.allclose(m.forward_head(tokens, pre_logits=True), tokens[:, 1:].mean(dim=1))
    assert torch.allclose(m(x), m.head(tokens[:, 1:].mean(dim=1)))
    m.reset_classifier(0)
    assert isinstance(m.get_classifier(), torch.nn.Identity) and m(x).shape == (2, 64)
    with pytest.raises(ValueError, match=r"global_pool must be one of \('token', 'avg'\), got 'map'"):
        m.reset_classifier(3, global_pool="map")
    with pytest.raises(ValueError, match=r"num_classes must be an integer in \[0, 1000000\], got -1"):
        m.reset_classifier(-1)
    no_cls = create_model("vit_nano", class_token=False, global_pool="avg")
    with pytest.raises(ValueError, match="global_pool='token' needs a class token"):
        no_cls.reset_classifier(3, global_pool="token")


@pytest.mark.parametrize("name", ["vit_nano", "diff_vit_nano", "dg_vit_nano"])
def test_grad_checkpointing_gives_the_same_gradients(name, monkeypatch):
    base = nano(name, depth=2, img_size=16, embed_dim=32).double()
    ckpt = copy.deepcopy(base)
    ckpt.set_grad_checkpointing(True)
    calls = []
    real = vit_module.checkpoint
    monkeypatch.setattr(vit_module, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    for m in (base, ckpt):
        m(x).square().sum().backward()
    assert len(calls) == 2  # one per block, only in the checkpointed model
    for (n, p), q in zip(base.named_parameters(), ckpt.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-12, atol=1e-14), n
    with torch.no_grad():  # no graph, nothing to recompute: checkpoint is skipped
        ckpt(x)
    assert len(calls) == 2
    with pytest.raises(TypeError, match="enable must be a bool, got str"):
        ckpt.set_grad_checkpointing("yes")


def test_no_weight_decay_names_tokens_and_lambdas():
    m = nano()
    names = m.no_weight_decay()
    params = dict(m.named_parameters())
    lambdas = {n for n in params if n.rsplit(".", 1)[-1] in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}
    assert len(lambdas) == 16 and names == {"pos_embed", "cls_token"} | lambdas
    assert create_model("vit_nano").no_weight_decay() == {"pos_embed", "cls_token"}


def test_layer_decay_through_timm_optimizer_factory():
    import timm.optim

    m = nano()
    opt = timm.optim.create_optimizer_v2(m, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.65)
    scale_of = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    decay_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    n_layers = 4 + 2  # stem, 4 blocks, final norm (+ head)
    params = dict(m.named_parameters())
    assert scale_of[id(params["pos_embed"])] == pytest.approx(0.65 ** (n_layers - 1))
    assert scale_of[id(params["patch_embed.proj.weight"])] == pytest.approx(0.65 ** (n_layers - 1))
    for i in range(4):
        assert scale_of[id(params[f"blocks.{i}.attn.q_proj.weight"])] == pytest.approx(0.65 ** (n_layers - 2 - i))
    assert scale_of[id(params["head.weight"])] == pytest.approx(1.0)
    lam = next(p for n, p in params.items() if n.startswith("blocks.0.") and n.endswith("lambda_q1"))
    assert decay_of[id(lam)] == 0.0 and decay_of[id(params["pos_embed"])] == 0.0
    assert decay_of[id(params["blocks.0.attn.q_proj.weight"])] == 0.05
    assert len(scale_of) == len(params)  # every parameter in exactly one group
    groups = m.group_matcher(coarse=True)
    assert set(groups) == {"stem", "blocks"}


def test_forward_intermediates_match_a_manual_pass():
    m = nano().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        h, outs = m._embed(x), []
        for blk in m.blocks:
            h = blk(h)
            outs.append(h)
        final, inter = m.forward_intermediates(x, indices=[0, -1], output_fmt="NLC")
        assert torch.equal(final, m.norm(h)) and torch.equal(final, m.forward_features(x))
        assert len(inter) == 2 and torch.equal(inter[0], outs[0][:, 1:]) and torch.equal(inter[1], outs[3][:, 1:])
        maps = m.forward_intermediates(x, 2, norm=True, intermediates_only=True)
        assert [t.shape for t in maps] == [(2, 64, 8, 8)] * 2
        expect = m.norm(outs[2])[:, 1:].reshape(2, 8, 8, 64).permute(0, 3, 1, 2)  # (B, D, h, w)
        assert torch.equal(maps[0], expect)
        paired = m.forward_intermediates(x, [1], return_prefix_tokens=True, intermediates_only=True)
        assert torch.equal(paired[0][1], outs[1][:, :1]) and paired[0][0].shape == (2, 64, 8, 8)
    assert take_indices(4, None) == ([0, 1, 2, 3], 3) and take_indices(4, 1) == ([3], 3)
    assert take_indices(4, (-1, 0, 0)) == ([0, 3], 3)
    with pytest.raises(ValueError, match=r"indices must be block indices in \[-4, 4\), got \[4\]"):
        m.forward_intermediates(x, [4])
    with pytest.raises(ValueError, match=r"indices as an int .* must be in \[1, 4\], got 5"):
        m.forward_intermediates(x, 5)
    with pytest.raises(ValueError, match=r"output_fmt must be one of \('NCHW', 'NLC'\), got 'NHWC'"):
        m.forward_intermediates(x, output_fmt="NHWC")


def test_prune_intermediate_layers_keeps_the_features():
    m = nano().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = m.forward_intermediates(x, [1], intermediates_only=True)
        assert m.prune_intermediate_layers([1], prune_norm=True) == [1]
        assert len(m.blocks) == 2 and isinstance(m.norm, torch.nn.Identity) and m.num_classes == 0
        assert torch.equal(m.forward_intermediates(x, [1], intermediates_only=True)[0], want[0])


def test_timm_create_model_features_only():
    fm = timm.create_model("diffattn_diff_vit_nano", features_only=True, out_indices=(1, 3))
    assert fm.feature_info.channels() == [64, 64] and fm.feature_info.reduction() == [4, 4]
    assert fm.feature_info.module_name() == ["blocks.1", "blocks.3"]
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats = fm(x)
        assert [f.shape for f in feats] == [(2, 64, 8, 8)] * 2
        assert torch.equal(feats[1], fm.model.forward_intermediates(x, [3], intermediates_only=True)[0])
    last3 = timm.create_model("dg_vit_nano", features_only=True, output_fmt="NLC")
    assert last3.feature_info.module_name() == ["blocks.1", "blocks.2", "blocks.3"] and last3(x)[0].shape == (2, 64, 64)
    with pytest.raises(ValueError, match=r"\['out_indices'\] need features_only=True"):
        timm.create_model("diff_vit_nano", out_indices=(1,))
    ours = create_model("diff_vit_nano", features_only=True, out_indices=[-1], feature_cfg={"norm": True}).eval()
    with torch.no_grad():  # the normalised last block is forward_features' patch tokens, as a (B, D, 8, 8) map
        want = ours.model.forward_features(x)[:, 1:].reshape(2, 8, 8, 64).permute(0, 3, 1, 2)
        assert torch.equal(ours(x)[0], want)
    assert ours.feature_info.channels() == [64] and ours.model_name == "diff_vit_nano"
    with pytest.raises(ValueError, match="features_only=True needs a vision transformer, got CLIP"):
        create_model("clip_tiny", features_only=True)


def test_resolve_data_config_and_pretrained_cfg():
    from timm.data import resolve_data_config

    cfg = resolve_data_config({}, model=create_model("diff_vit_nano"))
    assert cfg == {"input_size": (3, 32, 32), "interpolation": "bicubic", "mean": IMAGENET_MEAN,
                   "std": IMAGENET_STD, "crop_pct": 1.0, "crop_mode": "center"}
    big = create_model("diff_vit_base_patch16_224", depth=1)
    assert resolve_data_config({}, model=big)["crop_pct"] == 0.9 and big.default_cfg == big.pretrained_cfg
    grey = create_model("vit_nano", in_chans=1).pretrained_cfg
    assert grey["input_size"] == (1, 32, 32) and grey["mean"] == pytest.approx((sum(IMAGENET_MEAN) / 3,))
    assert create_model("vit_nano").pretrained_cfg["architecture"] == "vit_nano"


def test_head_init_scale_as_train_py_does():
    m = timm.create_model("diff_vit_nano", in_chans=3, drop_rate=0.0, drop_path_rate=0.1).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = m(x) - m.get_classifier().bias
        m.get_classifier().weight.mul_(0.1)
        m.get_classifier().bias.mul_(0.1)
        assert torch.allclose(m(x) - m.get_classifier().bias, 0.1 * before, atol=1e-6)
    m.set_grad_checkpointing(enable=True)
    assert m.grad_checkpointing and isinstance(m, VisionTransformer)


# ------------------------------------------------------------------------------------------ timm's train.py

TRAIN_PY = Path(os.environ.get("TIMM_TRAIN_PY", REPO / "third_party" / "timm" / "train.py"))


def _image_folder(root: Path, n_per_class: int = 8) -> None:
    """Fashion-MNIST images (the first ``n_per_class`` of classes 0-2) as PNGs in timm's ImageFolder layout."""
    from PIL import Image

    from diffattn.data import get_dataset

    ds = get_dataset("fashion_mnist", split="train", root=DATA)
    for split in ("train", "validation"):
        for c in range(3):
            (root / split / f"c{c}").mkdir(parents=True, exist_ok=True)
        counts = {c: 0 for c in range(3)}
        offset = 0 if split == "train" else 1000
        for i in range(offset, len(ds.labels)):
            c = int(ds.labels[i])
            if c < 3 and counts[c] < n_per_class:
                Image.fromarray(ds.images[i]).convert("RGB").resize((32, 32)).save(root / split / f"c{c}" / f"{i}.png")
                counts[c] += 1
            if all(v == n_per_class for v in counts.values()):
                break


@pytest.mark.slow
def test_timm_train_py_runs_a_diffattn_vit(tmp_path):
    if not TRAIN_PY.is_file():
        pytest.skip(f"timm's train.py not found at {TRAIN_PY} (set TIMM_TRAIN_PY to pytorch-image-models/train.py)")
    if not (DATA / "fashion_mnist" / ".prepared").is_file():
        pytest.skip(f"Fashion-MNIST not installed under {DATA}: run `make data`")
    _image_folder(tmp_path / "imgs")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "diffattn", "timm-train", str(TRAIN_PY), "--data-dir", str(tmp_path / "imgs"),
           "--model", "diff_vit_nano", "--num-classes", "3", "--grad-checkpointing",
           "--head-init-scale", "0.1", "--layer-decay", "0.65", "--epochs", "1", "--batch-size", "8",
           "--validation-batch-size", "8", "--input-size", "3", "32", "32", "--workers", "0", "--no-prefetcher",
           "--opt", "adamw", "--lr", "1e-3", "--device", "cpu", "--warmup-epochs", "0", "--sched", "cosine",
           "--log-interval", "1",
           "--output", str(out), "--experiment", "tiny"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = (out / "tiny" / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("epoch,train_loss") and len(summary) == 2
    loss = float(summary[1].split(",")[1])
    assert math.isfinite(loss) and abs(loss - math.log(3)) < 1.0  # 3 classes, head scaled by 0.1: near ln 3
    sd = read_checkpoint(out / "tiny" / "last.pth.tar")  # torch.load(weights_only=True)
    assert create_model("diff_vit_nano", num_classes=3).load_state_dict(sd, strict=True)
    shutil.rmtree(out)


def test_clip_grad_checkpointing_and_no_weight_decay():
    torch.manual_seed(0)
    base = create_model("diffclip_tiny", vision_img_size=16, text_context_length=8).double()
    ckpt = copy.deepcopy(base)
    ckpt.set_grad_checkpointing(True)
    assert ckpt.visual.grad_checkpointing and ckpt.text.grad_checkpointing
    images = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    tokens = torch.tensor([[5, 7, 49407, 0, 0, 0, 0, 0], [9, 3, 4, 2, 49407, 0, 0, 0]])
    for m in (base, ckpt):
        out = m(images, tokens)
        (out["logits_per_image"].square().sum() + out["image_embed"].sum()).backward()
    for (n, p), q in zip(base.named_parameters(), ckpt.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-10, atol=1e-12), n
    names = base.no_weight_decay()
    params = dict(base.named_parameters())
    assert {"logit_scale", "visual.pos_embed", "visual.cls_token", "text.pos_embed"} <= names <= set(params)
    assert sum(n.endswith("lambda_q1") for n in names) == 4  # 2 vision + 2 text blocks
