"""Text classifiers (Transformer / DT / DGT, M-DGSA 2025) and the word vocabulary."""

import pytest
import torch

from diffattn.models import create_model, from_pretrained, list_models
from diffattn.models.text import TextClassifier, Vocabulary

TINY = dict(vocab_size=50, embed_dim=32, depth=1, num_heads=4, max_len=16)
TEXTS = ["The cat sat on the mat.", "the dog sat", "A cat, a dog!", "the end", "zebra"]


def test_vocabulary_build_encode_save_load(tmp_path):
    v = Vocabulary.build(TEXTS, min_freq=2, max_size=None)
    # counts: the 4, sat 2, cat 2, dog 2, a 2, "." 1, "," 1 ... ; ties alphabetical
    assert v.tokens == ["<pad>", "<unk>", "the", "a", "cat", "dog", "sat"]
    assert len(Vocabulary.build(TEXTS, min_freq=1, max_size=5)) == 5
    assert Vocabulary.build(TEXTS, min_freq=1, max_size=5).tokens[2:] == ["the", "a", "cat"]
    assert v.encode("The zebra sat") == [2, 1, 6] and v.encode("the cat sat", max_length=2) == [2, 4]
    ids, mask = v.encode_batch(["the cat sat on", "dog", ""], max_length=3)
    assert ids.tolist() == [[2, 4, 6], [5, 0, 0], [1, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    ids, _ = v(["dog"], max_length=4, padding="max_length")
    assert ids.shape == (1, 4) and v.decode(ids[0]) == "dog"
    v.save(tmp_path / "vocab.json")
    w = Vocabulary.load(tmp_path / "vocab.json")
    assert w.tokens == v.tokens and w.lowercase is True and "cat" in w
    with pytest.raises(ValueError, match="min_freq"):
        Vocabulary.build(TEXTS, min_freq=0)
    with pytest.raises(ValueError, match="max_size"):
        Vocabulary.build(TEXTS, max_size=1)
    with pytest.raises(ValueError, match="texts"):
        Vocabulary.build("a single string")
    with pytest.raises(ValueError, match="padding"):
        v.encode_batch(["x"], padding="right")


def test_registry_names_build_forward_backward():
    names = list_models("t_*") + list_models("dt_*") + list_models("dgt_*")
    assert {"t_tiny", "t_rt", "t_base", "t_mnli", "dt_tiny", "dgt_tiny", "dt_base_x2", "dt_base_x4",
            "dt_base_x16_3", "dgt_rt_x4", "dgt_mnli_x16_3"} <= set(names)
    assert len(names) == 4 + 2 * (1 + 3 * 3)
    ids = torch.randint(1, 50, (2, 6))
    for name in names:
        m = create_model(name, **TINY)
        out = m(ids)
        assert out.shape == (2, m.num_classes), name
        out.sum().backward()
        assert all(p.grad is not None for p in m.parameters()), name
    dgt = create_model("dgt_base_x4", vocab_size=10)
    assert dgt.blocks[0].attn.num_heads == 16 and not dgt.blocks[0].attn.q_residual
    assert dgt.blocks[0].mlp.up_proj.out_features == 512  # ×4: fused width 1024 split into gate and up halves
    assert create_model("t_mnli", vocab_size=10).num_classes == 3


def test_parameter_differences_follow_mdgsa_table7():
    """Table 7 (Rotten Tomatoes, 4 layers × 256): Transformer 5.1M, DT/DGT ×2 3.8M, ×4 4.6M, ×16/3 5.1M."""
    with torch.device("meta"):  # counts only; no memory, no init
        n = {k: sum(p.numel() for p in create_model(k, vocab_size=10).parameters())
             for k in ("t_rt", "dt_rt_x2", "dt_rt_x4", "dt_rt_x16_3", "dgt_rt_x4")}
    assert (n["t_rt"] - n["dt_rt_x2"]) / 1e6 == pytest.approx(5.1 - 3.8, abs=0.06)
    assert (n["dt_rt_x4"] - n["dt_rt_x2"]) / 1e6 == pytest.approx(4.6 - 3.8, abs=0.06)
    assert (n["dt_rt_x16_3"] - n["dt_rt_x4"]) / 1e6 == pytest.approx(5.1 - 4.6, abs=0.06)
    assert n["dgt_rt_x4"] - n["dt_rt_x4"] == 4 * (256 * 8 + 8 - 4 * 16)  # gate D→H (+bias) replaces 4d λ values


def test_attention_switch_changes_only_attention():
    shapes = {}
    for att in ("standard", "diff", "gated"):
        m = create_model("dt_tiny", **TINY, attention=att)
        shapes[att] = {k: v.shape for k, v in m.state_dict().items() if ".attn." not in k}
    assert shapes["standard"] == shapes["diff"] == shapes["gated"]


@pytest.mark.parametrize("attention", ["standard", "diff", "gated"])
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_padding_does_not_change_logits(attention, pool):
    m = TextClassifier(**TINY, attention=attention, pool=pool).eval()
    ids = torch.randint(1, 50, (1, 5))
    padded = torch.cat([ids, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a, b = m(ids), m(padded)
        c = m(padded, torch.cat([torch.ones(1, 5), torch.zeros(1, 7)], dim=1).long())
    assert (a - b).abs().max().item() <= 1e-5 and (a - c).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="max_len"):
        m(torch.ones(1, 17, dtype=torch.long))


def test_save_load_round_trip_exact(tmp_path):
    m = create_model("dgt_tiny", **TINY, num_classes=4).eval()
    m.save_pretrained(tmp_path)
    m2 = from_pretrained(tmp_path).eval()
    assert type(m2) is TextClassifier and m2.model_name == "dgt_tiny" and m2.num_classes == 4
    sd, sd2 = m.state_dict(), m2.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    ids = torch.randint(1, 50, (2, 7))
    assert torch.equal(m(ids), m2(ids))
    assert len(m.attention_maps(ids)) == 1 and m.attention_maps(ids)[0].second.shape == (2, 2, 8, 8)


def test_tiny_dgt_learns_keyword_task():
    """A data-built vocabulary and a DGT learn "good"/"bad" keyword sentiment in a few steps."""
    torch.manual_seed(0)
    words = "the movie was plot actors very quite and really".split()
    texts, labels = [], []
    for i in range(32):
        g = torch.Generator().manual_seed(i)
        body = [words[j] for j in torch.randint(0, len(words), (6,), generator=g)]
        body.insert(int(torch.randint(0, 6, (1,), generator=g)), "good" if i % 2 else "bad")
        texts.append(" ".join(body))
        labels.append(i % 2)
    vocab = Vocabulary.build(texts, min_freq=2)
    ids, mask = vocab.encode_batch(texts, max_length=16)
    y = torch.tensor(labels)
    m = create_model("dgt_tiny", vocab_size=len(vocab), embed_dim=32, depth=1, drop_rate=0.0, max_len=16)
    opt = torch.optim.AdamW(m.parameters(), lr=5e-3)
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(m(ids, mask), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        acc = (m(ids, mask).argmax(-1) == y).float().mean().item()
    assert acc == 1.0 and loss.item() < 0.1
