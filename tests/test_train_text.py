"""The tiny text recipe trains DGT on SpamAssassin: the loss goes down, and the saved model with its vocabulary
classifies held-out mail better than always answering the majority class."""

import pytest
import torch

from diffattn.train import load_config, train


@pytest.mark.slow
@pytest.mark.data
def test_tiny_text_loss_goes_down_and_model_beats_majority_on_val(tmp_path, one_thread):
    from diffattn.data import DatasetNotInstalledError, get_dataset
    from diffattn.models import TextClassifier, Vocabulary, from_pretrained

    cfg = load_config("tiny/text",
                      ["run.steps=40", "run.log_every=1", "run.ckpt_every=40", "run.progress=false"])
    try:
        val = get_dataset("spamassassin", split="val")
    except DatasetNotInstalledError as e:
        pytest.skip(f"tiny/text needs SpamAssassin: {e}")
    losses = train(cfg, out=tmp_path)["losses"]
    assert len(losses) == 40 and all(v == v for v in losses)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.05, (first, last)

    model = from_pretrained(tmp_path / "model").eval()  # what `diffattn eval RUN_DIR` loads
    assert isinstance(model, TextClassifier) and model.attention == "gated"
    vocab = Vocabulary.load(tmp_path / "model" / "vocab.json")
    assert 100 < len(vocab) <= model.vocab_size and vocab.tokens[:2] == ["<pad>", "<unk>"]
    ids, mask = vocab.encode_batch(val.texts, cfg.data.block_size, padding="max_length")  # (N, 64) each
    y = torch.tensor([d["label"] for d in val.documents])
    with torch.no_grad():
        acc = (model(ids, mask).argmax(-1) == y).float().mean().item()
    majority = max(y.float().mean().item(), 1 - y.float().mean().item())
    print(f"val accuracy {acc:.3f}, majority class {majority:.3f}, loss {first:.3f} -> {last:.3f}")
    assert len(y) > 400 and acc > majority + 0.05, (acc, majority)


@pytest.mark.slow
@pytest.mark.data
def test_text_dataset_vocabulary_from_train_split_only():
    from diffattn.data import DatasetNotInstalledError, get_dataset
    from diffattn.models import Vocabulary
    from diffattn.train.data import text_classification_dataset

    try:
        val, vocab = text_classification_dataset("spamassassin", "val", vocab_size=50, block_size=8)
    except DatasetNotInstalledError as e:
        pytest.skip(f"needs SpamAssassin: {e}")
    ids, mask, y = val.tensors
    assert ids.shape == mask.shape == (len(y), 8) and len(vocab) == 50
    assert int(ids.max()) < 50 and set(y.tolist()) == {0, 1}
    assert torch.equal(mask.bool(), ids != vocab.pad_id)  # right padding only; every kept word has an id > 0
    train = get_dataset("spamassassin", split="train")
    assert vocab.tokens == Vocabulary.build(train.texts, min_freq=2, max_size=50).tokens  # train split, deterministic
    want, _ = vocab.encode_batch(get_dataset("spamassassin", split="val").texts, 8, padding="max_length")
    assert torch.equal(ids, want)
