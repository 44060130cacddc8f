"""timm VisionTransformer and open_clip bindings: identity at step 0, masks, maps, save/load."""

import copy

import pytest
import torch

import diffattn.adapters as A


def tiny_vit(fused=True):
    import timm

    m = timm.models.vision_transformer.VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=2,
                                                         num_heads=4, num_classes=5)
    for blk in m.blocks:
        blk.attn.fused_attn = fused
    return m.eval()


@pytest.mark.parametrize("fused", [True, False])
def test_timm_identity_every_method(fused):
    torch.manual_seed(0)
    base = tiny_vit(fused)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = base(x)
    for method in A.METHODS:
        model = A.retrofit(copy.deepcopy(base), method)
        assert len(A.adapters(model)) == 2
        with torch.no_grad():
            assert (model(x) - ref).abs().max().item() <= (1e-5 if fused else 1e-6), method
        A.step(model, 500)
        with torch.no_grad():
            assert (model(x) - ref).abs().max().item() > 1e-4


def test_timm_fused_and_eager_agree_with_mask():
    torch.manual_seed(0)
    f = A.retrofit(tiny_vit(True), "daa", anneal_steps=10)
    for _, a in A.adapters(f):
        a.W_daa.data.add_(0.2 * torch.randn_like(a.W_daa))
        a.advance(5)
    e = A.retrofit(tiny_vit(False), "daa", anneal_steps=10)
    e.load_state_dict(f.state_dict())
    x = torch.randn(2, 5, 32)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()  # bool, True = attend
    fmask = torch.zeros(5, 5).masked_fill(~mask, torch.finfo(torch.float32).min)
    af, ae = f.blocks[0].attn, e.blocks[0].attn
    with torch.no_grad():
        assert (af(x, attn_mask=mask) - ae(x, attn_mask=fmask)).abs().max().item() < 1e-5
        assert (af(x, is_causal=True) - ae(x, attn_mask=fmask)).abs().max().item() < 1e-5


def tiny_open_clip():
    import open_clip

    cfg = {"embed_dim": 16, "vision_cfg": {"image_size": 16, "layers": 2, "width": 32, "patch_size": 8,
                                           "head_width": 8},
           "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 4, "layers": 2}}
    return open_clip.CLIP(**cfg).eval()


def test_open_clip_identity_save_load(tmp_path):
    torch.manual_seed(0)
    base = tiny_open_clip()
    img, txt = torch.randn(2, 3, 16, 16), torch.randint(1, 63, (2, 8))
    with torch.no_grad():
        ri, rt = base.encode_image(img), base.encode_text(txt)
    pristine = copy.deepcopy(base)
    for method in A.METHODS:
        model = A.retrofit(copy.deepcopy(base), method)
        assert len(A.adapters(model)) == 4  # text causal (float -inf mask) and vision blocks
        with torch.no_grad():
            assert (model.encode_image(img) - ri).abs().max().item() <= 1e-5, method
            assert (model.encode_text(txt) - rt).abs().max().item() <= 1e-5, method
    assert set(base.state_dict()) <= set(model.state_dict())  # in_proj_weight / out_proj names kept
    A.step(model, 300)
    A.save_adapter(model, tmp_path)
    loaded = A.load_adapter(pristine, tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded.encode_text(txt), model.encode_text(txt))
    attn = model.transformer.resblocks[0].attn
    x = torch.randn(2, 8, 32)
    out, maps = attn(x, x, x, need_weights=True)
    assert maps.shape == (2, 8, 8)
    with pytest.raises(NotImplementedError):
        attn(x, torch.randn(2, 3, 32), torch.randn(2, 3, 32))
