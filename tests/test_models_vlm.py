"""The LLaVA-style VLM: text wiring against the plain causal LM, KV-cached generation, padding, the CLIP tower load,
save/load, LLaVA's stages, and a tiny model that learns to name the colour of known images."""

from __future__ import annotations

import pytest
import torch

from diffattn.models import create_model, from_pretrained, model_config
from diffattn.models.vlm import BOS_ID, EOS_ID, IGNORE_INDEX, SPECIAL_TOKENS, VisionLanguageModel, split_words

VOCAB = ["what", "is", "this", "?", "colour", "red", "green", "blue", "yes", "no", "a", "frog"]


def tiny(name="llava_diffclip_tiny", **kw):
    torch.manual_seed(0)
    return create_model(name, vocab=VOCAB, **kw).eval()


def test_registered_towers_are_the_clip_towers():
    assert model_config("llava_clip_tiny")["vision"] == model_config("clip_tiny")["vision"]
    assert model_config("llava_diffclip_tiny")["vision"] == model_config("diffclip_tiny")["vision"]
    m = tiny()
    assert m.num_image_tokens == 64 and m.lm.vocab_size == len(SPECIAL_TOKENS) + len(VOCAB)


def test_text_positions_match_the_causal_lm():
    """With the image features replaced by token embeddings, the VLM is exactly the causal LM on the joined ids."""
    m = tiny("llava_clip_tiny")
    img_ids = torch.randint(5, 17, (2, m.num_image_tokens))
    m.image_features = lambda images: m.lm.tok_embed(img_ids)  # (B, P, D)
    batch = m.collate(["what is this?", "is this a frog?"], ["red", "yes"])
    logits = m(torch.zeros(2, 3, 32, 32), **batch)["logits"]
    for b in range(2):  # the unpadded part of each row
        n = int(batch["attention_mask"][b].sum())
        ref = m.lm(torch.cat([img_ids[b], batch["input_ids"][b, :n]])[None])[0]
        torch.testing.assert_close(logits[b, :m.num_image_tokens + n], ref, atol=1e-5, rtol=1e-5)


def test_collate_labels_only_the_answer():
    m = tiny()
    b = m.collate(["what is this?"], ["red"])
    ids, labels = b["input_ids"][0].tolist(), b["labels"][0].tolist()
    w = {t: i + len(SPECIAL_TOKENS) for i, t in enumerate(VOCAB)}
    assert ids == [BOS_ID, w["what"], w["is"], w["this"], w["?"], 4, w["red"], EOS_ID]
    assert labels == [IGNORE_INDEX] * 5 + [w["red"], EOS_ID, IGNORE_INDEX]
    assert m.encode_text("A zebra?") == [w["a"], 1, w["?"]]  # unknown word → <unk>
    assert m.decode([w["red"], w["frog"], EOS_ID, w["blue"]]) == "red frog"
    assert split_words("Is there a “Sierra-Beauty” apple?") == ["is", "there", "a", "sierra-beauty", "apple", "?"]


@pytest.mark.slow
def test_generate_with_cache_is_greedy_full_recompute_and_padding_free():
    m = tiny()
    images = torch.randn(2, 3, 32, 32)
    qs = ["is this a red frog?", "colour?"]  # different lengths: the second row is padded
    b = m.collate(qs)
    got = m.generate(images, b["input_ids"], b["attention_mask"], max_new_tokens=3)
    for i, q in enumerate(qs):  # one row at a time, no cache, no padding: argmax of the full forward
        ids = m.collate([q])["input_ids"]
        for t in range(got.shape[1]):
            nxt = m(images[i:i + 1], ids)["logits"][0, -1].argmax()
            assert int(nxt) == int(got[i, t]), (i, t)
            if int(nxt) == EOS_ID:
                break
            ids = torch.cat([ids, nxt.view(1, 1)], 1)


def test_bad_inputs_are_named():
    m = tiny()
    with pytest.raises(ValueError, match="images must be a \\(B, 3, H, W\\) tensor"):
        m.image_features(torch.zeros(3, 32, 32))
    with pytest.raises(ValueError, match="input_ids must be an integer tensor"):
        m(torch.zeros(1, 3, 32, 32), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="same batch size"):
        m(torch.zeros(2, 3, 32, 32), torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="vocab must hold unique words"):
        create_model("llava_clip_tiny", vocab=["a", "a"])
    with pytest.raises(ValueError, match="vision_feature_layer must be an int in \\[-2, -1\\]"):
        create_model("llava_clip_tiny", vocab=VOCAB, vision_feature_layer=-3)
    with pytest.raises(ValueError, match="stage must be 1"):
        m.set_stage(3)


def test_feature_layer_and_projector():
    m = tiny(vision_feature_layer=-1)
    x = torch.randn(2, 3, 32, 32)
    ref = m.projector(m.visual.forward_features(x)[:, 1:])
    torch.testing.assert_close(m.image_features(x), ref)
    m2 = tiny(vision_feature_layer=-2)
    m2.load_state_dict(m.state_dict())
    after_block0 = m2.visual.blocks[0](m2.visual._embed(x))
    torch.testing.assert_close(m2.image_features(x), m2.projector(after_block0[:, 1:]))


def test_clip_tower_loads_strictly_and_stages_freeze(tmp_path):
    torch.manual_seed(1)
    clip = create_model("diffclip_tiny")
    clip.save_pretrained(tmp_path / "clip")
    vlm = VisionLanguageModel.from_clip(tmp_path / "clip", lm=model_config("llava_diffclip_tiny")["lm"],
                                        vocab=VOCAB)
    for k, v in clip.visual.state_dict().items():
        assert torch.equal(vlm.visual.state_dict()[k], v), k
    with pytest.raises(ValueError, match="does not match"):
        tiny("llava_clip_tiny").load_vision_tower(clip)  # a standard tower cannot take differential weights
    vlm.set_stage(1)
    assert {n.split(".")[0] for n, p in vlm.named_parameters() if p.requires_grad} == {"projector"}
    vlm.set_stage(2)
    assert {n.split(".")[0] for n, p in vlm.named_parameters() if p.requires_grad} == {"projector", "lm"}
    vlm.save_pretrained(tmp_path / "vlm")
    back = from_pretrained(tmp_path / "vlm")
    assert back.vocab == VOCAB
    x, b = torch.randn(1, 3, 32, 32), vlm.collate(["what is this?"])
    torch.testing.assert_close(back.eval()(x, **b)["logits"], vlm.eval()(x, **b)["logits"])


@pytest.mark.slow
def test_learns_the_colour_of_known_images(one_thread):
    """LLaVA's two stages on solid-colour images: the trained model names each image's colour."""
    from diffattn.train.llava import train_llava

    torch.set_num_threads(1)
    colours = {"red": (1.0, -1.0, -1.0), "green": (-1.0, 1.0, -1.0), "blue": (-1.0, -1.0, 1.0)}
    g = torch.Generator().manual_seed(0)
    data = []
    for name, rgb in colours.items():
        for _ in range(8):
            img = torch.tensor(rgb).view(3, 1, 1).expand(3, 32, 32) + 0.1 * torch.randn(3, 32, 32, generator=g)
            data.append((img, "what colour is this?", name))
    m = tiny("llava_clip_tiny")
    losses = train_llava(m, data, stage1_steps=40, stage2_steps=40, batch_size=12, stage2_lr=3e-3,
                         stage1_lr=3e-3, warmup=5)
    assert losses[-1] < 0.2 * losses[0]
    test = torch.stack([torch.tensor(rgb).view(3, 1, 1).expand(3, 32, 32) for rgb in colours.values()])
    assert m.answer(test, ["what colour is this?"] * 3) == list(colours)
