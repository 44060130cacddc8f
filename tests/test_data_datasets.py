"""diffattn.data built-in datasets: real samples, counts, disjoint deterministic splits, clear missing-data errors.

Tests that need a dataset prepared by ``make data`` are marked ``data`` and skip with the reason when it is missing.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from diffattn.data import (
    DATASETS,
    SETUP_COMMAND,
    CaptionImages,
    DatasetNotInstalledError,
    default_root,
    get_dataset,
    hash_split,
    list_datasets,
)

REPO = Path(__file__).resolve().parents[1]
ROOT = default_root()  # the data directory the library reads (docs/data.md)
FASHION_SRC = Path("/usr/share/datasets/fashion-mnist")
TUXPAINT_SRC = Path("/usr/share/tuxpaint/stamps")


def needs(name: str):
    """Mark a test as needing a prepared dataset; skip with the setup command when it is missing."""
    installed = DATASETS[name].installed(ROOT)
    return [pytest.mark.data,
            pytest.mark.skipif(not installed, reason=f"{name} not installed under {ROOT}: run `{SETUP_COMMAND}`")]


def apply(marks):
    def deco(fn):
        for m in marks:
            fn = m(fn)
        return fn
    return deco


# ------------------------------------------------------------------------------------------------ no data needed
def test_list_datasets_names_every_set():
    assert list_datasets() == ["fashion_mnist", "tuxpaint_captions", "emoji", "tuxpaint_vqa", "digits",
                               "state_of_the_union", "moby_dick", "spamassassin"]
    assert set(list_datasets(installed_only=True, root=ROOT)) <= set(list_datasets())


@pytest.mark.parametrize("name", ["fashion_mnist", "tuxpaint_captions", "emoji", "state_of_the_union",
                                  "moby_dick", "spamassassin"])
def test_missing_dataset_names_the_setup_command(tmp_path, name):
    with pytest.raises(DatasetNotInstalledError, match=rf"`{SETUP_COMMAND} \w+`") as err:
        get_dataset(name, split="train", root=tmp_path)
    assert isinstance(err.value, FileNotFoundError) and str(tmp_path) in str(err.value)
    assert name not in list_datasets(installed_only=True, root=tmp_path)


def test_unknown_name_and_split_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match=r"name must be one of .*'no_such_set'"):
        get_dataset("no_such_set")
    with pytest.raises(ValueError, match=r"split must be one of .*'validation'"):
        get_dataset("fashion_mnist", split="validation", root=tmp_path)
    with pytest.raises(ValueError, match=r"root must name the data"):
        get_dataset("csv")
    with pytest.raises(TypeError, match=r"get_dataset\('digits'\) takes no reader options .*\['block_size'\]"):
        get_dataset("digits", block_size=8)


def test_hash_split_is_fixed_and_close_to_80_10_10():
    # sha256("a frog")[:8] as a fraction of 2**64, computed independently
    import hashlib

    u = int(hashlib.sha256(b"a frog").hexdigest()[:16], 16) / 2**64
    assert hash_split("a frog") == ("train" if u < 0.8 else "val" if u < 0.9 else "test")
    counts = Counter(hash_split(f"item-{i}") for i in range(20000))
    assert abs(counts["train"] / 20000 - 0.8) < 0.01 and abs(counts["val"] / 20000 - 0.1) < 0.01
    assert [hash_split(f"item-{i}") for i in range(50)] == [hash_split(f"item-{i}") for i in range(50)]


def _fake_caption_set(root: Path, n: int = 40) -> Path:
    from PIL import Image

    folder = root / "tuxpaint_captions"
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    rows = []
    for i in range(n):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(folder / "images" / f"{i:04d}.png")
        Image.new("L", (8, 8), 255 * (i % 2)).save(folder / "masks" / f"{i:04d}.png")
        caption = f"A thing number {i // 2}."  # pairs of images share a caption
        rows.append({"key": f"cat{i % 3}/thing{i}", "image": f"images/{i:04d}.png", "mask": f"masks/{i:04d}.png",
                     "caption": caption, "category": f"cat{i % 3}", "group": caption.lower().rstrip(".")})
    (folder / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / ".prepared").write_text("fake\n")
    return folder


def test_caption_splits_keep_images_of_one_caption_together(tmp_path):
    _fake_caption_set(tmp_path)
    parts = {s: get_dataset("tuxpaint_captions", split=s, root=tmp_path) for s in ("train", "val", "test")}
    full = get_dataset("tuxpaint_captions", split="all", root=tmp_path)
    assert sum(len(p) for p in parts.values()) == len(full) == 40
    caps = {s: set(p.captions) for s, p in parts.items()}
    assert not caps["train"] & caps["val"] and not caps["train"] & caps["test"] and not caps["val"] & caps["test"]
    sample = full[3]
    assert sample["caption"] == "A thing number 1." and sample["key"] == "cat0/thing3"
    assert full.categories == ("cat0", "cat1", "cat2") and sample["category"] == 0
    assert sample["mask"].dtype == torch.bool and bool(sample["mask"].all())  # 255 → foreground
    assert not bool(full[2]["mask"].any())
    assert np.asarray(sample["image"])[0, 0].tolist() == [3, 0, 0]


def test_caption_set_applies_transform_to_the_image_only(tmp_path):
    _fake_caption_set(tmp_path, n=4)
    ds = CaptionImages("tuxpaint_captions", "all", root=tmp_path, transform=lambda im: np.asarray(im).shape)
    assert ds[1]["image"] == (8, 8, 3) and ds[1]["mask"].shape == (8, 8)


# ------------------------------------------------------------------------------------------------ Fashion-MNIST
@apply(needs("fashion_mnist"))
def test_fashion_mnist_counts_and_class_balance():
    trainval = get_dataset("fashion_mnist", split="trainval", root=ROOT)
    test = get_dataset("fashion_mnist", split="test", root=ROOT)
    assert len(trainval) == 60_000 and len(test) == 10_000
    assert np.bincount(trainval.labels).tolist() == [6000] * 10
    assert np.bincount(test.labels).tolist() == [1000] * 10
    assert trainval.images.shape == (60_000, 28, 28) and trainval.images.dtype == np.uint8
    assert len(get_dataset("fashion_mnist", split="all", root=ROOT)) == 70_000


@apply(needs("fashion_mnist"))
def test_fashion_mnist_samples_match_the_debian_files():
    if not FASHION_SRC.is_dir():
        pytest.skip(f"{FASHION_SRC} (Debian dataset-fashion-mnist) not installed here")
    with gzip.open(FASHION_SRC / "t10k-images-idx3-ubyte.gz") as f:
        raw = np.frombuffer(f.read(16 + 3 * 784), dtype=np.uint8)
    with gzip.open(FASHION_SRC / "t10k-labels-idx1-ubyte.gz") as f:
        raw_labels = np.frombuffer(f.read(8 + 3), dtype=np.uint8)
    test = get_dataset("fashion_mnist", split="test", root=ROOT)
    for i in range(3):
        image, label = test[i]
        assert np.array_equal(np.asarray(image), raw[16 + 784 * i:16 + 784 * (i + 1)].reshape(28, 28))
        assert label == int(raw_labels[8 + i])
    assert test[0][1] == 9 and test.classes[9] == "Ankle boot"  # the first test image is an ankle boot


@apply(needs("fashion_mnist"))
def test_fashion_mnist_splits_are_disjoint_and_deterministic():
    train = get_dataset("fashion_mnist", split="train", root=ROOT)
    val = get_dataset("fashion_mnist", split="val", root=ROOT)
    assert (len(train), len(val)) == (55_000, 5_000)
    assert not np.intersect1d(train.indices, val.indices).size
    assert np.array_equal(np.sort(np.concatenate([train.indices, val.indices])), np.arange(60_000))
    assert np.array_equal(val.indices, np.sort(np.random.default_rng(0).permutation(60_000)[:5000]))
    again = get_dataset("fashion_mnist", split="val", root=ROOT)
    assert np.array_equal(again.indices, val.indices) and np.array_equal(again.labels, val.labels)
    full = get_dataset("fashion_mnist", split="trainval", root=ROOT)
    i = 1234
    assert np.array_equal(val.images[i], full.images[val.indices[i]]) and val.labels[i] == full.labels[val.indices[i]]


# ------------------------------------------------------------------------------------------------ caption sets
@apply(needs("tuxpaint_captions"))
def test_tuxpaint_captions_counts_categories_and_real_captions():
    full = get_dataset("tuxpaint_captions", split="all", root=ROOT)
    assert len(full) >= 900
    assert len(full.categories) == 16 and "animals" in full.categories and "vehicles" in full.categories
    assert all(c.strip() for c in full.captions)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(full), 5, replace=False):
        key = full.keys[i]
        if TUXPAINT_SRC.is_dir():  # the caption is the first line of the stamp's English description
            first = (TUXPAINT_SRC / f"{key}.txt").read_text(encoding="utf-8", errors="replace").splitlines()[0]
            assert full.captions[i] == " ".join(first.split())
        assert full.categories[full.labels[i]] == key.split("/")[0]


@apply(needs("tuxpaint_captions"))
def test_tuxpaint_masks_are_the_alpha_foreground():
    full = get_dataset("tuxpaint_captions", split="all", root=ROOT)
    for i in (0, len(full) // 2, len(full) - 1):
        sample = full[i]
        image, mask = np.asarray(sample["image"]), sample["mask"].numpy()
        assert image.shape == (224, 224, 3) and mask.shape == (224, 224) and mask.dtype == bool
        assert 0.01 < mask.mean() < 0.99
        from PIL import Image

        alpha = np.asarray(Image.open(full.folder / full.rows[i]["mask"]))
        assert np.all(image[alpha == 0] == 255)  # transparent pixels show the white background


@apply(needs("tuxpaint_captions"))
def test_tuxpaint_splits_disjoint_by_image_and_caption_and_deterministic():
    parts = {s: get_dataset("tuxpaint_captions", split=s, root=ROOT) for s in ("train", "val", "test")}
    full = get_dataset("tuxpaint_captions", split="all", root=ROOT)
    keys = {s: set(p.keys) for s, p in parts.items()}
    assert sum(map(len, keys.values())) == len(full) and set.union(*keys.values()) == set(full.keys)
    caps = {s: {c.lower().rstrip(".") for c in p.captions} for s, p in parts.items()}
    assert not (caps["train"] & caps["val"] or caps["train"] & caps["test"] or caps["val"] & caps["test"])
    assert 0.7 < len(parts["train"]) / len(full) < 0.9 and len(parts["val"]) >= 50 and len(parts["test"]) >= 50
    assert get_dataset("tuxpaint_captions", split="test", root=ROOT).keys == parts["test"].keys


@apply(needs("emoji"))
def test_emoji_pairs_and_names():
    full = get_dataset("emoji", split="all", root=ROOT)
    assert len(full) >= 1000
    by_caption = dict(zip(full.captions, range(len(full))))
    assert full.rows[by_caption["grinning face"]]["emoji"] == "\U0001F600"
    assert full.categories[full.labels[by_caption["grinning face"]]] == "Smileys & Emotion"
    sample = full[by_caption["red apple"]]
    image = np.asarray(sample["image"])
    assert image.shape == (128, 128, 3) and image[..., 0][sample["mask"].numpy()].mean() > 150  # a red apple
    parts = [get_dataset("emoji", split=s, root=ROOT) for s in ("train", "val", "test")]
    assert sum(len(p) for p in parts) == len(full)
    groups = [{r["group"] for r in p.rows} for p in parts]
    assert not (groups[0] & groups[1] or groups[0] & groups[2] or groups[1] & groups[2])


# ------------------------------------------------------------------------------------------------ digits
def test_digits_splits_stratified_disjoint_and_complete():
    pytest.importorskip("sklearn")
    parts = {s: get_dataset("digits", split=s) for s in ("train", "val", "test")}
    full = get_dataset("digits", split="all")
    assert len(full) == 1797 and sum(len(p) for p in parts.values()) == 1797
    idx = np.concatenate([p.indices for p in parts.values()])
    assert np.array_equal(np.sort(idx), np.arange(1797))
    assert len(parts["test"]) == 359 and abs(len(parts["val"]) - 180) <= 1
    for p in parts.values():  # every class keeps its share (±2 images)
        share = np.bincount(p.labels, minlength=10) / len(p)
        assert np.all(np.abs(share - np.bincount(full.labels) / 1797) * len(p) <= 2)
    from sklearn.datasets import load_digits

    image, label = full[0]
    assert np.array_equal(np.asarray(image), np.rint(load_digits().images[0] * 255 / 16)) and label == 0
    assert np.array_equal(get_dataset("digits", split="val").indices, parts["val"].indices)


# ------------------------------------------------------------------------------------------------ text corpora
@apply(needs("state_of_the_union"))
def test_state_of_the_union_documents_and_splits():
    full = get_dataset("state_of_the_union", split="all", root=ROOT)
    assert len(full) == 233
    first, last = full[0], full[len(full) - 1]
    assert (first["year"], first["name"]) == (1790, "George Washington")
    assert first["text"].startswith("Fellow-Citizens of the Senate and House of Representatives")
    assert (last["year"], last["name"], last["party"]) == (2021, "Joseph R Biden", "Democratic")
    parts = [get_dataset("state_of_the_union", split=s, root=ROOT) for s in ("train", "val", "test")]
    keys = [{d["key"] for d in p.documents} for p in parts]
    assert sum(map(len, keys)) == 233 and not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])


@apply(needs("moby_dick"))
def test_moby_dick_in_book_order():
    full = get_dataset("moby_dick", split="all", root=ROOT)
    assert len(full) == 138 and [d["key"] for d in full.documents[:3]] == ["etymology", "extracts", "chapter_1"]
    assert full.documents[2]["text"].startswith("Call me Ishmael.") and full.documents[-1]["key"] == "epilogue"


@apply(needs("spamassassin"))
def test_spamassassin_documents_and_labels():
    full = get_dataset("spamassassin", split="all", root=ROOT)
    assert len(full) == 6046 and sum(d["label"] for d in full.documents) == 1896
    from diffattn.data import email_to_text

    upper = get_dataset("spamassassin", split="train", root=ROOT, transform=str.upper)
    raw = json.loads(Path(upper.documents[0]["path"]).read_text(encoding="utf-8"))["text"]
    assert upper[0]["text"] == email_to_text(raw).upper() and upper[0]["key"] == upper.documents[0]["key"]
