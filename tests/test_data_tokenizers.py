"""GPT-2 ids through tiktoken with the shipped ranks, the CLIP tokenizer, token counts and `diffattn data tokenize`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from diffattn.cli import main
from diffattn.data import (
    DATASETS,
    GPT2_EOT,
    SETUP_COMMAND,
    DatasetNotInstalledError,
    TextTokenizer,
    TokenMemmap,
    clip_tokenizer,
    default_root,
    get_dataset,
    get_tokenizer,
    gpt2_tokenizer,
    read_token_meta,
    tokenize_documents,
)

REPO = Path(__file__).resolve().parents[1]
ROOT = default_root()
RANKS = ROOT / "tokenizers" / "gpt2.tiktoken"
needs_ranks = pytest.mark.skipif(not RANKS.is_file(), reason=f"GPT-2 ranks missing ({RANKS}): run `{SETUP_COMMAND}`")


def needs(name: str):
    return pytest.mark.skipif(not DATASETS[name].installed(ROOT),
                              reason=f"{name} not installed under {ROOT}: run `{SETUP_COMMAND}`")


def test_missing_gpt2_ranks_name_the_setup_command(tmp_path):
    with pytest.raises(DatasetNotInstalledError, match=r"`diffattn data prepare gpt2`.*openai-whisper"):
        gpt2_tokenizer(tmp_path / "gpt2.tiktoken")


@pytest.mark.data
@needs_ranks
def test_gpt2_ids_are_the_published_ones():
    enc = gpt2_tokenizer(RANKS)
    # ids from GPT-2's encoder.json (Radford et al. 2019), as Hugging Face's GPT2Tokenizer returns them
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.encode_ordinary(" the") == [262] and enc.encode_ordinary("!") == [0]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [GPT2_EOT] and enc.n_vocab == 50257
    text = "Differential attention cancels noise: (A1 − λ·A2)V, 2024."
    assert enc.decode(enc.encode_ordinary(text)) == text


@pytest.mark.data
@needs_ranks
def test_gpt2_matches_transformers_tokenizer_when_its_files_are_local():
    """Cross-check against the Hugging Face GPT-2 tokenizer when a local copy exists (offline: never downloads)."""
    transformers = pytest.importorskip("transformers")
    try:
        hf = transformers.AutoTokenizer.from_pretrained("gpt2", local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure means no local copy
        pytest.skip(f"no local Hugging Face gpt2 tokenizer ({type(e).__name__})")
    text = "It was the best of times, it was the worst of times; 1,234 whales."
    assert gpt2_tokenizer(RANKS).encode_ordinary(text) == hf(text)["input_ids"]


def test_clip_tokenizer_layout():
    tok = clip_tokenizer(context_length=16)
    ids = tok(["a photo of a cat", "a dog"])
    assert ids.shape == (2, 16)
    assert ids[0, 0].item() == 49406 and ids[0, 6].item() == 49407 and ids[0, 7:].eq(0).all()
    assert ids[0, 1:6].tolist() == tok.encode("a photo of a cat") and tok.encode("a cat") == [320, 2368]
    with pytest.raises(ValueError, match="context_length must be an int >= 2"):
        clip_tokenizer(context_length=1)


def test_tokenize_documents_appends_the_end_of_text_id():
    tok = TextTokenizer("chars", lambda s: [ord(c) for c in s], eot=0, vocab_size=256)
    assert tokenize_documents(["ab", "c"], tok).tolist() == [97, 98, 0, 99, 0]
    clip = get_tokenizer("clip")
    assert tokenize_documents(["a cat"], clip).tolist() == [320, 2368, 49407]
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        get_tokenizer("bert")
    with pytest.raises(TypeError, match="texts must hold str"):
        tokenize_documents([b"bytes"], tok)


@pytest.mark.data
@needs_ranks
@needs("state_of_the_union")
def test_state_of_the_union_is_about_2_07m_gpt2_tokens():
    ids = tokenize_documents(get_dataset("state_of_the_union", split="all", root=ROOT).texts, _gpt2())
    assert 2_050_000 < len(ids) < 2_090_000  # 2,074,301 with one end-of-text per address
    assert int((ids == GPT2_EOT).sum()) == 233 and ids.max() < 50257


def _gpt2() -> TextTokenizer:
    enc = gpt2_tokenizer(RANKS)
    return TextTokenizer("gpt2", enc.encode_ordinary, GPT2_EOT, enc.n_vocab)


@pytest.mark.data
@needs_ranks
@needs("moby_dick")
def test_cli_tokenize_writes_a_readable_token_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DIFFATTN_DATA", str(ROOT))
    out = tmp_path / "moby_val.bin"
    assert main(["data", "tokenize", "moby_dick", "--tokenizer", "gpt2", "--split", "val", "--out", str(out)]) == 0
    docs = get_dataset("moby_dick", split="val", root=ROOT)
    expected = tokenize_documents(docs.texts, _gpt2())
    assert f"{len(expected)} gpt2 tokens" in capsys.readouterr().out
    assert np.array_equal(np.fromfile(out, dtype="<u2"), expected)
    assert read_token_meta(out) == {"dtype": "uint16", "n_tokens": len(expected), "tokenizer": "gpt2",
                                    "vocab_size": 50257}
    x, y = TokenMemmap(out, block_size=64)[0]
    assert x.tolist() == expected[:64].tolist() and y.tolist() == expected[1:65].tolist()
    with pytest.raises(SystemExit, match="NAME must be a text set"):
        main(["data", "tokenize", "fashion_mnist", "--out", str(tmp_path / "x.bin")])
