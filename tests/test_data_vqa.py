"""diffattn.data.vqa: head nouns, POPE negatives, MMNeedle grids, split by image; checked on known Tux Paint stamps.

Tests on the real stamps are marked ``data`` and skip when ``make data`` has not prepared them.
"""

from __future__ import annotations

from collections import Counter

import pytest

from diffattn.data import DATASETS, SETUP_COMMAND, default_root, get_dataset
from diffattn.data.vqa import (
    POPE_SPLITS,
    VQADataset,
    compose_grid,
    head_noun,
    needle_samples,
    noun_phrase,
    pope_questions,
    split_words,
    vqa_vocabulary,
    what_questions,
)
from diffattn.eval.vlm import vqa_score

ROOT = default_root()
needs_tuxpaint = pytest.mark.skipif(not DATASETS["tuxpaint_captions"].installed(ROOT),
                                    reason=f"tuxpaint_captions not installed under {ROOT}: run `{SETUP_COMMAND}`")


@pytest.mark.parametrize("caption,phrase,noun", [
    ("A little rabbit.", "little rabbit", "rabbit"),
    ("An albino peahen (a female peafowl, or peacock).", "albino peahen", "peahen"),
    ("A European coin of 2 euros (2 €).", "european coin", "coin"),
    ("The letter q.", "letter q", "letter"),
    ("A “Sierra Beauty” apple.", "sierra beauty apple", "apple"),
    ("A head of red lettuce.", "red lettuce", "lettuce"),
    ("A spider playing computer games.", "spider", "spider"),
    ("10 Japanese yen.", "10 japanese yen", "yen"),
    ("Sad!", "sad", "sad"),
    ("The sign for the letter T in American Sign Language.", "sign", "sign"),
])
def test_head_noun_and_phrase(caption, phrase, noun):
    assert noun_phrase(caption) == phrase
    assert head_noun(caption) == noun


def test_bad_caption_is_named():
    with pytest.raises(ValueError, match="caption must be a non-empty str"):
        head_noun("  ")
    with pytest.raises(TypeError, match="text must be a str"):
        split_words(3)


def test_what_answers_score_like_vqa():
    (q,) = what_questions([{"key": "k", "caption": "A little rabbit.", "category": "animals"}])
    assert q["answer"] == "rabbit" and len(q["answers"]) == 10
    assert vqa_score("rabbit", q["answers"]) == 1.0
    assert vqa_score("little rabbit", q["answers"]) == pytest.approx(0.9)  # 3 of 10 annotators said the phrase
    assert vqa_score("frog", q["answers"]) == 0.0


ROWS = [{"key": f"k{i}", "caption": c, "category": cat} for i, (c, cat) in enumerate([
    ("A frog.", "animals"), ("A frog.", "animals"), ("A toad.", "animals"), ("A lion.", "animals"),
    ("A lion.", "animals"), ("A lion.", "animals"), ("An apple.", "food"), ("A pear.", "food"),
    ("A bus.", "vehicles"), ("A car.", "vehicles")])]


def test_pope_balanced_and_negatives_by_split():
    for split in POPE_SPLITS:
        qs = pope_questions(ROWS, split, seed=0)
        assert len(qs) == 2 * len(ROWS)
        assert Counter(q["answer"] for q in qs) == {"yes": len(ROWS), "no": len(ROWS)}
        for i, row in enumerate(ROWS):
            yes, no = qs[2 * i], qs[2 * i + 1]
            assert yes["object"] == head_noun(row["caption"]) and yes["question"] == f"is there a {yes['object']} " \
                                                                                    f"in the image?"
            assert no["object"] != yes["object"]
    # popular: among the 3 most frequent objects (lion 3, frog 2, then alphabetical: apple)
    assert {q["object"] for q in pope_questions(ROWS, "popular") if q["answer"] == "no"} <= {"lion", "frog", "apple"}
    # adversarial: an object of the image's own category (a stamp of food gets the other food)
    adv = pope_questions(ROWS, "adversarial")
    assert adv[13]["object"] == "pear" and adv[15]["object"] == "apple"  # rows 6 (apple) and 7 (pear)
    assert adv[17]["object"] == "car" and adv[19]["object"] == "bus"
    assert pope_questions(ROWS, "random", seed=0) == pope_questions(ROWS, "random", seed=0)
    with pytest.raises(ValueError, match="split must be one of"):
        pope_questions(ROWS, "hard")


def test_needle_grids():
    qs = needle_samples(ROWS, n=2, count=40, seed=1)
    exists = [q for q in qs if q["kind"] == "needle_exists"]
    assert len(exists) == 40 and 10 <= sum(q["answer"] == "yes" for q in exists) <= 30
    for q in qs:
        grid = [ROWS[j]["caption"] for j in q["images"]]
        assert len(q["images"]) == 4 and len(set(q["images"])) == 4
        if q["needle"] is None:
            assert q["caption"] not in grid and q["answer"] == "no"
        else:
            _, r, c = q["needle"]
            assert grid[2 * r + c] == q["caption"] and grid.count(q["caption"]) == 1
            want = {"needle_exists": "yes", "needle_row": ("top", "bottom")[r], "needle_col": ("left", "right")[c]}
            assert q["answer"] == want[q["kind"]]
    n_pos = sum(q["needle"] is not None for q in exists)
    assert Counter(q["kind"] for q in qs) == {"needle_exists": 40, "needle_row": n_pos, "needle_col": n_pos}
    rows = ROWS + [{"key": f"x{i}", "caption": f"A thing {i}.", "category": "misc"} for i in range(6)]
    cells = needle_samples(rows, n=3, count=5, seed=0, exists_fraction=1.0)
    assert sum(q["kind"] == "needle_cell" for q in cells) == 5
    for q in cells:
        if q["kind"] == "needle_cell":
            assert q["answer"] == f"row {q['needle'][1] + 1} column {q['needle'][2] + 1}"
    with pytest.raises(ValueError, match="rows must hold more than n\\*n"):
        needle_samples(ROWS, n=4)
    with pytest.raises(ValueError, match="whose caption differs from the needle"):
        needle_samples(ROWS, n=3, count=20)  # 3 lions among 10 rows: a lion needle has 7 distractors


def test_compose_grid_places_cells():
    from PIL import Image

    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (0, 0, 0)]
    grid = compose_grid([Image.new("RGB", (32, 32), c) for c in colours], 2)
    assert grid.size == (32, 32)
    assert [grid.getpixel(p) for p in ((4, 4), (20, 4), (4, 20), (20, 20))] == colours


def test_vocabulary_splits_like_the_tokenizer():
    qs = what_questions(ROWS)
    vocab = vqa_vocabulary(qs, extra=["Is there a lion?"])
    assert {"what", "is", "this", "?", "frog", "lion", "there"} <= set(vocab) and vocab == sorted(vocab)
    assert split_words("A “Sierra-Beauty” apple?") == ["a", "sierra-beauty", "apple", "?"]


@pytest.mark.data
@needs_tuxpaint
def test_known_stamps():
    ds = VQADataset("all", kinds=("what", "category"), root=ROOT)
    by_key = {ds.images.rows[q["images"][0]]["key"]: q for q in ds.questions if q["kind"] == "what"}
    assert by_key["animals/amphibians/frog"]["answer"] == "frog"
    assert by_key["animals/birds/albino_peahen"]["answer"] == "peahen"
    assert by_key["food/vegetables/redlettuce"]["answer"] == "lettuce"
    cats = {ds.images.rows[q["images"][0]]["key"]: q["answer"] for q in ds.questions if q["kind"] == "category"}
    assert cats["vehicles/iso_fireengine"] == "vehicles" and cats["animals/birds/penguin"] == "animals"
    sample = ds[0]
    assert sample["image"].size == (224, 224) and sample["question"] == "what is this?"


@pytest.mark.data
@needs_tuxpaint
def test_splits_by_image_and_catalog():
    train = VQADataset("train", kinds=("what", "pope", "needle"), root=ROOT, needle_count=20)
    test = VQADataset("test", kinds=("what", "pope", "needle"), root=ROOT, needle_count=20)
    train_caps, test_caps = set(train.images.captions), set(test.images.captions)
    assert train_caps and test_caps and not train_caps & test_caps
    for q in test.questions:  # every image of a test question, needle distractors included, is a test image
        assert all(test.images.rows[j]["caption"] in test_caps for j in q["images"])
    grid = test[next(i for i, q in enumerate(test.questions) if q["kind"] == "needle_exists")]
    assert grid["image"].size == (224, 224)
    assert Counter(q["split"] for q in test.questions if q["kind"] == "pope") == {
        s: 2 * len(test.images) for s in POPE_SPLITS}
    ds = get_dataset("tuxpaint_vqa", "test", root=ROOT)
    assert len(ds) > len(test) and {q["kind"] for q in ds.questions} >= {"what", "category", "pope", "needle_row"}
