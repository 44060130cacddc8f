"""open_clip seams: a retrofitted open_clip model converts to diffattn's CLIP (the same function), through the model
object or base weights + a save_adapter folder; diffattn's CLIP works with open_clip's zero-shot helpers."""

import copy

import pytest
import torch

import diffattn.adapters as A
from diffattn.convert import load_open_clip
from diffattn.eval.classification import zero_shot_classifier
from diffattn.models import create_model

open_clip = pytest.importorskip("open_clip")

CFG = {"embed_dim": 16, "vision_cfg": {"image_size": 16, "layers": 2, "width": 32, "patch_size": 8, "head_width": 8},
       "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 4, "layers": 2}}


def trained_retrofit(method):
    """A tiny open_clip CLIP retrofitted with ``method``, its adapters moved off their init, 7 of 10 steps in."""
    torch.manual_seed(0)
    base = open_clip.CLIP(**CFG).eval()
    model = A.retrofit(copy.deepcopy(base), method, lambda_init="ye", anneal_steps=10)
    for _, a in A.adapters(model):
        for p in a.parameters():
            p.data.add_(0.1 * torch.randn_like(p))
    A.step(model, 7)
    return base, model


def inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, 16, 16, generator=g), torch.randint(1, 63, (2, 8), generator=g)


@pytest.mark.parametrize("method", A.METHODS)
def test_load_open_clip_accepts_a_retrofitted_model(method):
    base, model = trained_retrofit(method)
    clip = load_open_clip(model).eval()
    assert len(A.adapters(clip)) == 4 and A.retrofit_config(clip) == A.retrofit_config(model)
    img, txt = inputs()
    with torch.no_grad():
        ours = (clip.encode_image(img), clip.encode_text(txt))
        theirs = (model.encode_image(img), model.encode_text(txt))
        for a, b in zip(ours, theirs, strict=True):
            assert (a - b).abs().max().item() <= 1e-5
        moved = max((clip.encode_image(img) - base.encode_image(img)).abs().max().item(),
                    (clip.encode_text(txt) - base.encode_text(txt)).abs().max().item())
    assert moved > 1e-3  # the retrofit is there, not just the base weights
    A.step(clip, 3)  # the schedule continues where open_clip's stopped
    assert all(int(a.step_buffer) == 10 for _, a in A.adapters(clip))


def test_load_open_clip_from_base_weights_and_an_adapter_folder(tmp_path):
    base, model = trained_retrofit("daa")
    A.save_adapter(model, tmp_path / "adapter")
    clip = load_open_clip(base.state_dict(), adapter=tmp_path / "adapter", vision_num_heads=4,
                          text_num_heads=4).eval()
    img, txt = inputs()
    with torch.no_grad():
        assert (clip.encode_text(txt) - model.encode_text(txt)).abs().max().item() <= 1e-5
        assert (clip.encode_image(img) - model.encode_image(img)).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match=r"src holds retrofit adapter tensors \('visual.transformer.resblocks.0.attn"
                                         r".diff_adapter.W_daa', ...\) but no retrofit config"):
        load_open_clip(model.state_dict())
    with pytest.raises(ValueError, match="src is already retrofitted; pass adapter= only with base weights"):
        load_open_clip(model, adapter=tmp_path / "adapter")


def test_retrofit_of_diffattn_standard_attention_starts_from_the_model():
    torch.manual_seed(0)
    vit = create_model("vit_nano", depth=2).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = vit(x)
    A.retrofit(vit, "diffq", train="all")
    assert [n for n, _ in A.adapters(vit)] == ["blocks.0.attn.diff_adapter", "blocks.1.attn.diff_adapter"]
    with torch.no_grad():
        assert (vit(x) - ref).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="does not support a rotary embedding"):
        A.retrofit(create_model("lm_tiny"), "daa")


def test_open_clip_zero_shot_helper_matches_the_library():
    torch.manual_seed(0)
    model = create_model("diffclip_tiny").eval()
    classes, templates = ["cat", "dog", "tux the penguin"], ["a photo of a {}.", "a drawing of a {}."]
    theirs = open_clip.build_zero_shot_classifier(model, model.tokenizer, classes, templates,
                                                  num_classes_per_batch=2)  # (E, C)
    ours = zero_shot_classifier(model, classes, templates)  # (C, E)
    assert theirs.shape == (64, 3) and torch.allclose(theirs.t(), ours, atol=1e-6)
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        feats = model.encode_image(images, normalize=True)
        assert torch.allclose(feats.norm(dim=-1), torch.ones(4), atol=1e-6)
        logits = 100.0 * feats @ theirs  # open_clip_train's zero-shot scoring
    assert torch.equal(logits.argmax(-1), (feats @ ours.t()).argmax(-1))


def test_open_clip_checkpoint_functions_round_trip_a_retrofit(tmp_path):
    from safetensors.torch import save_file

    base, model = trained_retrofit("diffk")
    path = tmp_path / "retro.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    fresh = A.retrofit(open_clip.CLIP(**CFG).eval(), A.retrofit_config(model))
    open_clip.load_checkpoint(fresh, str(path))  # strict: the adapter tensors keep open_clip's module paths
    img, txt = inputs()
    with torch.no_grad():
        assert torch.equal(fresh.encode_image(img), model.encode_image(img))
        assert torch.equal(fresh.encode_text(txt), model.encode_text(txt))
    with pytest.raises(ValueError, match="src holds retrofit adapter tensors"):
        load_open_clip(path)
