"""A causal LM carries its tokenizer: GPT-2 BPE through tiktoken (local ranks) or a Hugging Face tokenizer, saved
with save_pretrained, restored by from_pretrained, used by generate_text; round trips on real text."""

import os
from pathlib import Path

import pytest
import torch

from diffattn.data import default_root
from diffattn.data.tokenizers import gpt2_tokenizer
from diffattn.models import create_model, from_pretrained
from diffattn.models.tokenizer import TOKENIZER_CONFIG, as_lm_tokenizer, load_lm_tokenizer

REPO = Path(__file__).resolve().parents[1]
RANKS = default_root() / "tokenizers" / "gpt2.tiktoken"
needs_ranks = pytest.mark.skipif(not RANKS.is_file(), reason=f"GPT-2 ranks missing ({RANKS}): run `make data`")

# Melville, Moby-Dick (1851), ch. 1: public domain
TEXT = ("Call me Ishmael. Some years ago—never mind how long precisely—having little or no money in my purse, and "
        "nothing particular to interest me on shore, I thought I would sail about a little and see the watery part "
        "of the world.")


def tiny_lm(vocab_size):
    torch.manual_seed(0)
    return create_model("diff_lm_tiny", vocab_size=vocab_size, depth=1).eval()


@needs_ranks
def test_gpt2_tokenizer_saves_and_loads_with_the_model(tmp_path):
    enc = gpt2_tokenizer(RANKS)
    model = tiny_lm(50304).set_tokenizer(enc)
    assert model.tokenizer.encode("Hello world") == [15496, 995] and model.tokenizer.eot_token_id == 50256
    ids = model.tokenizer.encode(TEXT)
    assert ids == enc.encode_ordinary(TEXT) and model.tokenizer.decode(ids) == TEXT
    out = model.generate_text("Call me Ishmael.", max_new_tokens=5)
    prompt = enc.encode_ordinary("Call me Ishmael.")
    new = model.generate(torch.tensor([prompt]), 5, eos_token_id=50256)[0, len(prompt):].tolist()
    assert len(out) > 0 and out == enc.decode(new[: (new + [50256]).index(50256)])
    model.save_pretrained(tmp_path / "lm")
    assert {"tokenizer.tiktoken", TOKENIZER_CONFIG} <= set(os.listdir(tmp_path / "lm"))
    loaded = from_pretrained(tmp_path / "lm").eval()
    assert loaded.tokenizer.encode(TEXT) == ids and loaded.tokenizer.decode(ids) == TEXT
    assert loaded.generate_text("Call me Ishmael.", max_new_tokens=5) == out
    ranks = tmp_path / "lm" / "tokenizer.tiktoken"
    ranks.write_bytes(ranks.read_bytes().replace(b" 0\n", b" 1\n", 1))
    with pytest.raises(ValueError, match=r"tokenizer.tiktoken has SHA-256 [0-9a-f]{64}, but .* says [0-9a-f]{64}"):
        from_pretrained(tmp_path / "lm")


def _hf_bpe():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator([TEXT] * 4, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")


def test_hf_tokenizer_saves_and_loads_with_the_model(tmp_path):
    hf = _hf_bpe()
    model = tiny_lm(512).set_tokenizer(hf)
    ids = hf.encode(TEXT, add_special_tokens=False)
    assert model.tokenizer.encode(TEXT) == ids and model.tokenizer.decode(ids) == TEXT
    assert model.tokenizer.eot_token_id == hf.convert_tokens_to_ids("<|endoftext|>") == 0
    out = model.generate_text("Call me", max_new_tokens=4)
    model.save_pretrained(tmp_path / "lm")
    loaded = from_pretrained(tmp_path / "lm").eval()
    assert loaded.tokenizer.encode(TEXT) == ids and loaded.generate_text("Call me", max_new_tokens=4) == out
    assert load_lm_tokenizer(tmp_path) is None  # a folder without a tokenizer


def test_lm_without_a_tokenizer_says_how_to_add_one():
    model = tiny_lm(512)
    with pytest.raises(ValueError, match=r"generate_text needs a tokenizer: model.set_tokenizer\('gpt2'\)"):
        model.generate_text("Call me Ishmael.")
    with pytest.raises(TypeError, match="tokenizer must be 'gpt2', a tiktoken.Encoding or a transformers tokenizer, "
                                        "got int"):
        model.set_tokenizer(3)
    hf = _hf_bpe()
    assert 300 < len(hf) <= 400
    with pytest.raises(ValueError, match=f"tokenizer has {len(hf)} tokens but the model's vocab_size is 300"):
        tiny_lm(300).set_tokenizer(hf)
    with pytest.raises(ValueError, match="prompt must be a non-empty string"):
        model.set_tokenizer(hf).generate_text("")
    assert as_lm_tokenizer(model.tokenizer) is model.tokenizer
