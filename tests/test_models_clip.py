"""CLIP / DiffCLIP family: every registered name at a tiny size, per-tower switches, tokenizer, transforms,
save/load."""

import math

import pytest
import torch

from diffattn.layers import Attention, DiffAttention, GatedDiffAttention
from diffattn.models import create_model, from_pretrained
from diffattn.models import model_config as clip_config
from diffattn.models.clip import CLIP, CLIP_CONFIGS, clip_loss

CLIP_NAMES = list(CLIP_CONFIGS)

TINY = dict(embed_dim=16, vision_img_size=16, vision_patch_size=8, vision_embed_dim=32, vision_depth=2,
            vision_num_heads=4, text_embed_dim=32, text_depth=2, text_num_heads=4, text_context_length=12,
            text_vocab_size=1000)


def _tokens(b=3, n=12, vocab=1000):
    t = torch.randint(1, vocab - 1, (b, n))
    t[:, -4] = vocab - 1  # EOT: the largest id
    t[:, -3:] = 0
    return t


def test_names():
    variants = ("clip", "diffclip", "diffclip_star", "diffclip_dagger", "dgclip")
    assert CLIP_NAMES == [f"{v}_{s}" for v in variants for s in ("vit_b16", "vit_s16", "vit_ti16", "tiny")]


@pytest.mark.parametrize("name", CLIP_NAMES)
def test_every_name_forward_backward_tiny(name):
    model = create_model(name, **TINY)
    assert isinstance(model, CLIP) and model.model_name == name
    out = model(torch.randn(2, 3, 16, 16), _tokens())
    assert out["logits_per_image"].shape == (2, 3) and out["image_embed"].shape == (2, 16)
    assert torch.allclose(out["text_embed"].norm(dim=-1), torch.ones(3))
    (out["logits_per_image"].mean() + out["logits_per_text"].std()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_variants_set_towers_and_lambda():
    kinds = {}
    for variant in ("clip", "diffclip", "diffclip_star", "diffclip_dagger", "dgclip"):
        m = create_model(f"{variant}_tiny")
        kinds[variant] = (type(m.visual.blocks[0].attn), type(m.text.blocks[0].attn))
    assert kinds == {"clip": (Attention, Attention), "diffclip": (DiffAttention, DiffAttention),
                     "diffclip_star": (DiffAttention, DiffAttention),
                     "diffclip_dagger": (DiffAttention, Attention),
                     "dgclip": (GatedDiffAttention, GatedDiffAttention)}
    star = create_model("diffclip_star_tiny", vision_depth=3)
    assert [b.attn.lambda_init for b in star.visual.blocks] == pytest.approx(
        [0.8 - 0.6 * math.exp(-0.3 * i) for i in range(3)])
    assert star.text.blocks[0].attn.lambda_init == pytest.approx(0.2)
    assert all(b.attn.lambda_init == 0.8 for b in create_model("diffclip_tiny").text.blocks)
    # per-tower overrides
    m = create_model("clip_tiny", vision_attention="gated", text_lambda_init=0.5, attention="diff")
    assert type(m.visual.blocks[0].attn) is GatedDiffAttention and m.text.blocks[0].attn.lambda_init == 0.5


def test_b16_configuration_on_meta():
    cfg = clip_config("diffclip_vit_b16")
    assert cfg["text"] == dict(vocab_size=49408, context_length=77, embed_dim=512, depth=12, num_heads=8,
                               mlp="quick_gelu", attention=dict(kind="diff"))  # λ_init: the default 0.8
    assert (cfg["embed_dim"], cfg["vision"]["embed_dim"], cfg["vision"]["patch_size"]) == (512, 768, 16)
    assert clip_config("diffclip_vit_ti16")["vision"]["num_heads"] == 6
    assert clip_config("clip_vit_ti16")["vision"]["num_heads"] == 3
    with torch.device("meta"):
        m = create_model("diffclip_dagger_vit_b16")
    assert m.image_projection.shape == (768, 512) and len(m.text.blocks) == 12
    assert type(m.text.blocks[0].attn) is Attention and m.text.blocks[0].attn.num_heads == 8


def test_attention_switch_changes_only_attention_modules():
    sds = {v: create_model(f"{v}_tiny").state_dict() for v in ("clip", "diffclip", "dgclip")}
    outside = {v: {k: t.shape for k, t in sd.items() if ".attn." not in k} for v, sd in sds.items()}
    assert outside["clip"] == outside["diffclip"] == outside["dgclip"]


def test_save_pretrained_round_trip_exact(tmp_path):
    model = create_model("diffclip_star_tiny", **TINY).eval()
    model.save_pretrained(tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m").eval()
    assert type(loaded) is CLIP and loaded.model_name == "diffclip_star_tiny"
    sd, sd2 = model.state_dict(), loaded.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    images, tokens = torch.randn(2, 3, 16, 16), _tokens()
    a, b = model(images, tokens), loaded(images, tokens)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert loaded.text.blocks[1].attn.lambda_init == model.text.blocks[1].attn.lambda_init


def test_tokenizer_and_eot_pooling():
    pytest.importorskip("open_clip")
    model = create_model("diffclip_tiny").eval()
    tok = model.tokenizer(["a photo of a cat", "a dog"])
    assert tok.shape == (2, 32) and tok.dtype == torch.long
    assert tok[0, 0] == 49406 and tok[0].argmax() == 6 and tok[0, 6] == 49407  # SOT, 5 words, EOT
    with torch.no_grad():
        e = model.encode_text(tok)
        tok2 = tok.clone()
        tok2[:, 10:] = 123  # tokens after EOT cannot reach it through causal attention
        assert torch.equal(model.encode_text(tok2), e)


def test_transforms():
    from PIL import Image

    model = create_model("clip_tiny")
    img = Image.new("L", (50, 40), color=128)
    for t in (model.train_transform, model.eval_transform):
        x = t(img)
        assert x.shape == (3, 32, 32)
    rrc = model.train_transform.transforms[1]
    assert type(rrc).__name__ == "RandomResizedCrop" and rrc.scale == (0.5, 1.0)
    assert [type(t).__name__ for t in model.eval_transform.transforms[1:]] == [
        "Resize", "CenterCrop", "ToTensor", "Normalize"]
    assert model.eval_transform.transforms[-1].mean == (0.485, 0.456, 0.406)


def test_logit_scale_clamped_at_100():
    model = create_model("clip_tiny")
    assert model.scale().item() == pytest.approx(1 / 0.07)
    with torch.no_grad():
        model.logit_scale.fill_(10.0)
    assert model.scale().item() == 100.0
    model.clamp_logit_scale_()
    assert model.logit_scale.item() == pytest.approx(math.log(100))


def test_tiny_trains_on_cpu():
    torch.manual_seed(0)
    model = create_model("diffclip_tiny", **TINY)  # the registered tiny size trains the same way, ~4× slower
    images, tokens = torch.randn(8, 3, 16, 16), _tokens(8, 12)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for _ in range(12):
        loss = clip_loss(model(images, tokens)["logits_per_image"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.clamp_logit_scale_()
        losses.append(loss.item())
    assert losses[0] > 1.5 and losses[-1] < 0.5 * losses[0]  # 8 random pairs are memorised


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match=r"override 'width' is not an argument of CLIP"):
        create_model("clip_tiny", width=3)
    with pytest.raises(ValueError, match="vision has unknown arguments"):
        CLIP(vision={"width": 3})
    model = create_model("clip_tiny")
    with pytest.raises(ValueError, match="at most context_length=32 positions, got 40"):
        model.encode_text(torch.zeros(1, 40, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens must be an integer tensor"):
        model.encode_text(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="logits_per_image must be square"):
        clip_loss(torch.zeros(2, 3))
