"""Corruption tables, mCE, Gaussian-noise robustness and MMVP-VLM on a small set in the published layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffattn.eval.mmvp import mmvp_eval, mmvp_pair_correct, read_mmvp
from diffattn.eval.robustness import corrupt_images, corruption_table, mean_corruption_error, noise_robustness


def test_mean_corruption_error_hand_computed():
    table = {"fog": {1: 0.8, 2: 0.6}, "snow": {1: 0.5, 2: 0.3}}
    assert mean_corruption_error(table) == pytest.approx(45.0)  # 100 − 100·0.55
    with pytest.raises(ValueError, match="fractions"):
        mean_corruption_error({"fog": {1: 80.0}})


def _bright_dark(n=8, size=32):
    """Class 1 images are bright, class 0 dark: a mean-brightness threshold classifies them."""
    y = np.arange(n) % 2
    x = np.where(y[:, None, None, None] == 1, 200, 40).astype(np.uint8) * np.ones((n, size, size, 3), np.uint8)
    return x, torch.tensor(y)


def _transform(imgs):
    return torch.tensor(imgs, dtype=torch.float32).permute(0, 3, 1, 2) / 255.0


def _predict(x):  # score class 1 by brightness above 0.47
    m = x.mean(dim=(1, 2, 3))
    return torch.stack([0.47 - m, m - 0.47], dim=1)


def test_corruption_table_brightness_and_contrast():
    x, y = _bright_dark()
    r = corruption_table(_predict, x, y, _transform, corruptions=("brightness", "contrast"), severities=(1, 5),
                         progress=False)
    assert r["clean"] == 1.0
    # brightness raises every pixel's value: at severity 5 the dark images look bright → half wrong
    assert r["table"]["brightness"][5] == pytest.approx(0.5)
    assert set(r["table"]) == {"brightness", "contrast"} and set(r["table"]["contrast"]) == {1, 5}
    cells = [a for row in r["table"].values() for a in row.values()]
    assert r["mean_accuracy"] == pytest.approx(np.mean(cells))
    assert r["mce"] == pytest.approx(100 - 100 * np.mean(cells))


def test_corrupt_images_grey_and_checks():
    g = (np.random.default_rng(0).random((2, 32, 32)) * 255).astype(np.uint8)
    out = corrupt_images(g, "gaussian_noise", 3, seed=1)
    assert out.shape == g.shape and out.dtype == np.uint8 and not np.array_equal(out, g)
    np.testing.assert_array_equal(out, corrupt_images(g, "gaussian_noise", 3, seed=1))  # seeded
    small = (np.random.default_rng(1).random((3, 8, 8)) * 255).astype(np.uint8)  # upsampled ×4 and back
    for c in ("gaussian_noise", "zoom_blur", "frost"):
        out = corrupt_images(small, c, 2)
        assert out.shape == (3, 8, 8) and not np.array_equal(out, small)
    with pytest.raises(ValueError, match="severity must be"):
        corrupt_images(g, "fog", 6)
    with pytest.raises(ValueError, match="corruption must be one of"):
        corrupt_images(g, "rain", 1)
    with pytest.raises(ValueError, match="images must be uint8"):
        corrupt_images(g.astype(np.float32), "fog", 1)


def test_noise_robustness_levels():
    x = torch.tensor([[1.0], [-1.0]]).repeat(50, 1)
    y = (x[:, 0] > 0).long()

    def predict(b):
        return torch.cat([-b, b], dim=1)

    r = noise_robustness(predict, x, y, levels=(0.0, 100.0))
    assert r[0.0] == 1.0
    assert 0.3 < r[100.0] < 0.7  # noise swamps the signal: near chance


# ------------------------------------------------------------------------------------------------ MMVP-VLM


def test_mmvp_pair_correct_hand_computed():
    assert mmvp_pair_correct(torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    # statement 2 prefers image 1 (p = 0.5 vs 0.27): one statement wrong → the pair fails
    assert not mmvp_pair_correct(torch.tensor([[2.0, 2.0], [1.0, 0.0]]))
    assert not mmvp_pair_correct(torch.tensor([[0.0, 2.0], [2.0, 0.0]]))
    assert mmvp_pair_correct(torch.tensor([[0.0, 2.0], [2.0, 0.0]]), ids=(6, 5))  # even id first: swapped truth


class _ColourCLIP(torch.nn.Module):
    """encode_image: mean red and blue; encode_text: the (red, blue) word indicator from the tokenizer."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1))

    def encode_image(self, x):
        return torch.stack([x[:, 0].mean((1, 2)), x[:, 2].mean((1, 2))], dim=1) + 1e-3

    def encode_text(self, t):
        return t + 1e-3


def _colour_tokenizer(texts):
    assert all(t.startswith("a photo of ") for t in texts)
    return torch.tensor([[float("red" in t), float("blue" in t)] for t in texts])


def _write_mmvp(root):
    from PIL import Image

    colours = {"red": (255, 0, 0), "blue": (0, 0, 255)}
    rows = [(1, "Color and Appearance", "a red square", "red"), (2, "Color and Appearance", "a blue square", "blue"),
            (3, "Color and Appearance", "a blue square", "red"), (4, "Color and Appearance", "a red square", "blue"),
            (5, "Texts", "a red square", "red"), (6, "Texts", "a blue square", "red")]
    lines = ["Question ID,Type,Statement"]
    for qid, pattern, statement, colour in rows:
        d = root / "MLLM_VLM Images" / pattern
        d.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), colours[colour]).save(d / f"{qid}.jpg")
        lines.append(f"{qid},{pattern},{statement}")
    (root / "Questions.csv").write_text("\n".join(lines) + "\n")


def test_mmvp_eval_on_published_layout(tmp_path):
    _write_mmvp(tmp_path)
    pairs = read_mmvp(tmp_path)
    assert [p["ids"] for p in pairs] == [(1, 2), (3, 4), (5, 6)] and pairs[2]["pattern"] == "Texts"

    def to_tensor(img):
        return torch.tensor(np.asarray(img), dtype=torch.float32).permute(2, 0, 1) / 255.0

    r = mmvp_eval(_ColourCLIP(), tmp_path, transform=to_tensor, tokenizer=_colour_tokenizer, progress=False)
    # pair 1 right; pair 2's statements describe the other image; pair 3 has two red images (statement 6 fails)
    assert r["pairs"] == 3 and r["accuracy"] == pytest.approx(1 / 3)
    assert r["per_pattern"] == {"Color and Appearance": 0.5, "Texts": 0.0}
    (tmp_path / "Questions.csv").unlink()
    with pytest.raises(FileNotFoundError, match="Questions.csv is missing"):
        read_mmvp(tmp_path)
