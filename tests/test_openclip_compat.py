"""open_clip's model API on diffattn's CLIP family (diffattn.openclip): the same return types and shapes as open_clip's
own functions (compared on a tiny open_clip config registered here), open_clip's loss on the outputs, and
open_clip's training script (open_clip_train.main) training a diffattn CLIP from a local CSV."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

import diffattn
from diffattn.losses import clip_loss

open_clip = pytest.importorskip("open_clip")
TEXTS = ["a photo of a cat", "a drawing of a dog", "an emoji of a penguin"]


@pytest.fixture(scope="module")
def tiny_open_clip(tmp_path_factory):
    """An open_clip model config of diffclip_tiny's sizes (32×32 images, context 32), registered with open_clip."""
    path = tmp_path_factory.mktemp("oc") / "diffattn-test-tiny.json"
    path.write_text(json.dumps({"embed_dim": 64, "vision_cfg": {"image_size": 32, "layers": 1, "width": 64,
                                                                "patch_size": 4, "head_width": 16},
                                "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 4,
                                             "layers": 1}}))
    open_clip.add_model_config(path)
    return "diffattn-test-tiny"


def _image(size=40):
    from PIL import Image

    return Image.new("RGB", (size, size + 8), (200, 30, 90))


def test_create_model_and_transforms_and_get_tokenizer_return_what_open_clip_returns(tiny_open_clip):
    torch.manual_seed(0)
    theirs = open_clip.create_model_and_transforms(tiny_open_clip, output_dict=True)
    ours = diffattn.create_model_and_transforms("diffclip_tiny", output_dict=True)
    assert len(ours) == len(theirs) == 3
    (m, pre_train, pre_val), (om, opre_train, opre_val) = ours, theirs
    assert isinstance(m, diffattn.models.CLIP) and m.training and om.training
    for ours_t, theirs_t in ((pre_train, opre_train), (pre_val, opre_val)):
        assert type(ours_t) is type(theirs_t)  # torchvision Compose
        a, b = ours_t(_image()), theirs_t(_image())
        assert a.shape == b.shape == (3, 32, 32) and a.dtype == b.dtype == torch.float32
    tok, otok = diffattn.get_tokenizer("diffclip_tiny"), open_clip.get_tokenizer(tiny_open_clip)
    ids, oids = tok(TEXTS), otok(TEXTS)
    assert ids.dtype == oids.dtype == torch.int64 and torch.equal(ids, oids)  # same BPE, same context length 32
    assert tok.context_length == m.context_length == 32
    assert diffattn.get_tokenizer("diffclip_tiny", context_length=16)(TEXTS).shape == (3, 16)

    images = torch.stack([pre_val(_image(s)) for s in (40, 48, 56)])
    out, oout = m(images, ids), om(images, oids)
    assert out.keys() == oout.keys() == {"image_features", "text_features", "logit_scale"}
    for k in ("image_features", "text_features"):
        assert out[k].shape == oout[k].shape == (3, 64)
        assert torch.allclose(out[k].norm(dim=-1), torch.ones(3), atol=1e-5)
    assert out["logit_scale"].shape == oout["logit_scale"].shape == ()
    assert math.isclose(out["logit_scale"].item(), 1 / 0.07, rel_tol=1e-5)
    # open_clip's loss takes the dict as keyword arguments and gives diffattn's CLIP loss
    loss = open_clip.ClipLoss()(**out, output_dict=True)["contrastive_loss"]
    ref = clip_loss(out["logit_scale"] * out["image_features"] @ out["text_features"].t())
    assert abs(loss.item() - ref.item()) <= 1e-6
    # open_clip's other calls: keywords, one tower alone, the tuple form
    only = m(image=images)
    assert only["text_features"] is None and torch.allclose(only["image_features"], out["image_features"])
    assert m(text=ids)["image_features"] is None
    m.output_dict = False
    tup, otup = m(images, ids), open_clip.create_model(tiny_open_clip)(images, oids)
    assert isinstance(tup, tuple) and isinstance(otup, tuple) and len(tup) == len(otup) == 3
    assert torch.allclose(tup[0], out["image_features"])
    # diffattn's own convention is unchanged for models built by create_model
    plain = diffattn.create_model("diffclip_tiny")(images, ids)
    assert {"image_embed", "text_embed", "logits_per_image", "logits_per_text"} <= set(plain)


def test_create_model_from_pretrained_precision_and_refusals():
    model, preprocess = diffattn.create_model_from_pretrained("clip_tiny", precision="bf16")
    assert not model.training and model.logit_scale.dtype == torch.bfloat16 and preprocess(_image()).shape[0] == 3
    with pytest.raises(ValueError, match=r"not supported by diffattn's CLIP models: \{'force_quick_gelu': True\}"):
        diffattn.create_model_and_transforms("diffclip_tiny", force_quick_gelu=True)
    with pytest.raises(ValueError, match="'diff_vit_nano' is not a diffattn CLIP model"):
        diffattn.get_tokenizer("diff_vit_nano")
    with pytest.raises(ValueError, match="names tag 'openai', but pretrained='x'"):
        diffattn.create_model_and_transforms("clip_vit_b16.openai", "x")
    big, _, _ = diffattn.create_model_and_transforms("diffclip_tiny", force_image_size=64, force_context_length=16)
    assert big.img_size == 64 and big.context_length == 16


def test_patch_open_clip_train_routes_by_name_and_restores():
    pytest.importorskip("open_clip_train", reason="open_clip_train (open_clip_torch's training package) is missing")
    import open_clip_train.main as oc_main

    from diffattn.openclip import patch_open_clip_train

    before = oc_main.create_model_and_transforms
    with patch_open_clip_train():
        model, _, _ = oc_main.create_model_and_transforms("dgclip_tiny", output_dict=True)
        assert isinstance(model, diffattn.models.CLIP) and model.output_dict
        assert oc_main.get_tokenizer("dgclip_tiny").context_length == 32
        assert type(oc_main.get_tokenizer("RN50")).__name__ == "SimpleTokenizer"  # open_clip's own name
    assert oc_main.create_model_and_transforms is before


@pytest.fixture
def root_logging():
    """open_clip_train's main configures the root logger for its process; put it back after an in-process run."""
    import logging

    handlers, level = logging.root.handlers[:], logging.root.level
    levels = {name: lg.level for name, lg in logging.root.manager.loggerDict.items()
              if isinstance(lg, logging.Logger)}  # its setup_logging sets every logger's level
    yield
    for h in logging.root.handlers[:]:
        if h not in handlers:
            logging.root.removeHandler(h)
            h.close()
    logging.root.setLevel(level)
    for name, lg in logging.root.manager.loggerDict.items():
        if isinstance(lg, logging.Logger):
            lg.setLevel(levels.get(name, logging.NOTSET))


def test_open_clip_train_main_trains_a_diffattn_clip_from_a_csv(tmp_path, root_logging):
    """open_clip's own training script, 2 steps of diffclip_tiny on a local CSV of 8 image–caption pairs."""
    pytest.importorskip("open_clip_train", reason="open_clip_train (open_clip_torch's training package) is missing")
    pytest.importorskip("pandas", reason="open_clip_train's CSV dataset reads with pandas")
    from PIL import Image

    from diffattn.openclip import main

    rows = ["filepath\ttitle"]
    for i in range(8):
        color = (i * 37 % 256, i * 91 % 256, i * 53 % 256)
        Image.new("RGB", (36, 36), color).save(tmp_path / f"{i}.png")
        rows.append(f"{tmp_path / f'{i}.png'}\ta square of colour {color[0]} {color[1]} {color[2]}")
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    main(["--model", "diffclip_tiny", "--train-data", str(tmp_path / "pairs.csv"), "--dataset-type", "csv",
          "--csv-separator", "\t", "--batch-size", "4", "--epochs", "1", "--lr", "1e-3", "--warmup", "1",
          "--workers", "0", "--device", "cpu", "--precision", "fp32", "--seed", "0", "--log-every-n-steps", "1",
          "--logs", str(tmp_path / "logs"), "--name", "run"])
    log = (tmp_path / "logs" / "run" / "out.log").read_text()
    losses = [float(x) for x in re.findall(r"Contrastive_loss: ([0-9.]+) \(", log)]
    assert len(losses) == 2 and all(0 < x < 10 for x in losses), log[-2000:]
    saved = torch.load(tmp_path / "logs" / "run" / "checkpoints" / "epoch_1.pt", map_location="cpu")
    assert saved["epoch"] == 1 and saved["name"] == "run"
    trained = diffattn.create_model("diffclip_tiny")
    trained.load_state_dict(saved["state_dict"], strict=True)  # diffattn's own parameter names
    torch.manual_seed(0)  # open_clip_train seeds 0 before building the model: the same initial weights
    init = diffattn.create_model("diffclip_tiny")
    moved = [k for k, v in init.state_dict().items() if not torch.equal(v, trained.state_dict()[k])]
    assert "visual.blocks.0.attn.lambda_q1" in moved and len(moved) > 0.9 * len(init.state_dict())
