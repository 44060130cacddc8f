"""CLIP transforms against an independent float64 reference, timm classifier transforms, ImageNet-C corruptions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from diffattn.data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Corruption,
    classifier_transform,
    clip_transform,
    corruption_names,
    pixel_stats,
)


def _image(w: int = 300, h: int = 200, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))


def _reference_eval(img: Image.Image, size: int) -> np.ndarray:
    """Resize the short side to ``size`` (bicubic), centre-crop ``size``², scale to [0, 1], normalise (float64)."""
    w, h = img.size
    nw, nh = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    r = np.asarray(img.resize((nw, nh), Image.Resampling.BICUBIC), dtype=np.float64) / 255.0
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    r = r[top:top + size, left:left + size]
    return ((r - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)).transpose(2, 0, 1)


def test_clip_eval_transform_matches_float64_reference():
    img = _image()
    out = clip_transform(224)(img)
    assert out.shape == (3, 224, 224) and out.dtype == torch.float32
    np.testing.assert_allclose(out.double().numpy(), _reference_eval(img, 224), atol=1e-5)
    grey = img.convert("L")  # grey inputs become RGB (three equal channels before normalising)
    g = clip_transform(64)(grey) * torch.tensor(IMAGENET_STD)[:, None, None] + torch.tensor(IMAGENET_MEAN)[:, None,
                                                                                                              None]
    assert torch.allclose(g[0], g[1], atol=1e-6) and torch.allclose(g[1], g[2], atol=1e-6)


def test_clip_train_transform_crops_half_to_all_of_the_image():
    t = clip_transform(32, train=True)
    crop = t.transforms[0]
    assert type(crop).__name__ == "RandomResizedCrop" and crop.scale == (0.5, 1.0) and crop.size == (32, 32)
    torch.manual_seed(0)
    img = _image(100, 80)
    areas = []
    for _ in range(200):
        top, left, h, w = crop.get_params(img, crop.scale, crop.ratio)
        areas.append(h * w / (100 * 80))
    assert 0.5 - 1e-9 <= min(areas) and max(areas) <= 1.0 and np.mean(areas) > 0.6
    torch.manual_seed(1)
    a = t(img)
    torch.manual_seed(1)
    assert torch.equal(a, t(img)) and a.shape == (3, 32, 32)
    with pytest.raises(ValueError, match="scale must satisfy"):
        clip_transform(32, train=True, scale=(0.0, 1.0))
    with pytest.raises(ValueError, match="image_size must be a positive int, got 0"):
        clip_transform(0)


def test_classifier_transform_is_timms():
    timm_data = pytest.importorskip("timm.data")
    ours, theirs = classifier_transform(48), timm_data.create_transform(48, is_training=False)
    img = _image(64, 64)
    assert torch.equal(ours(img), theirs(img)) and ours(img).shape == (3, 48, 48)
    train = classifier_transform(48, train=True, hflip=0.0, color_jitter=None)
    assert "RandomResizedCrop" in repr(train) and train(img).shape == (3, 48, 48)


def test_corruption_names_and_bad_arguments():
    names = corruption_names()
    assert len(names) == 19 and names[0] == "gaussian_noise" and "saturate" in names
    with pytest.raises(ValueError, match=r"name must be one of .*got 'blur'"):
        Corruption("blur", 1)
    for bad in (0, 6, 2.0, True):
        with pytest.raises(ValueError, match=f"severity must be an int in 1..5, got {bad!r}"):
            Corruption("fog", bad)
    with pytest.raises(ValueError, match=r"image must be .*\(H, W, 3\) uint8"):
        Corruption("contrast", 1)(np.zeros((40, 40, 3), dtype=np.float32))


@pytest.mark.parametrize("severity", [1, 5])
def test_gaussian_noise_matches_imagenet_c_equation(severity):
    """x' = clip(x/255 + N(0, c_s²), 0, 1)·255 with c = (.08, .12, .18, .26, .38) (Hendrycks & Dietterich 2019)."""
    img = _image(40, 36)
    x = np.asarray(img, dtype=np.float64) / 255.0
    rng = np.random.RandomState(0)  # the corruption reseeds NumPy with seed·1000003 + call index = 0
    c = (0.08, 0.12, 0.18, 0.26, 0.38)[severity - 1]
    ref = np.uint8(np.clip(x + rng.normal(size=x.shape, scale=c), 0, 1) * 255)
    out = np.asarray(Corruption("gaussian_noise", severity, seed=0)(img))
    assert np.array_equal(out, ref)


def test_corruptions_are_deterministic_grow_with_severity_and_keep_size():
    img = _image(48, 40, seed=3)
    x = np.asarray(img, dtype=np.float64)
    state = np.random.get_state()
    diffs = []
    for s in (1, 3, 5):
        a = np.asarray(Corruption("shot_noise", s, seed=7)(img), dtype=np.float64)
        b = np.asarray(Corruption("shot_noise", s, seed=7)(img), dtype=np.float64)
        assert np.array_equal(a, b) and a.shape == x.shape
        diffs.append(np.abs(a - x).mean())
    assert diffs[0] < diffs[1] < diffs[2]
    assert np.array_equal(np.random.get_state()[1], state[1])  # the global generator is left as it was
    for name in ("contrast", "pixelate", "jpeg_compression", "fog", "motion_blur"):
        out = Corruption(name, 3)(img)
        assert out.size == img.size and out.mode == "RGB" and np.abs(np.asarray(out, dtype=np.float64) - x).mean() > 1


def test_corruption_of_small_grey_images_keeps_their_size():
    grey = Image.fromarray(np.tile(np.arange(28, dtype=np.uint8) * 9, (28, 1)))  # Fashion-MNIST's size
    out = Corruption("contrast", 5)(grey)
    assert out.size == (28, 28) and out.mode == "RGB"
    before, after = np.asarray(grey, dtype=np.float64), np.asarray(out.convert("L"), dtype=np.float64)
    assert after.std() < 0.5 * before.std()  # contrast at severity 5 keeps 5 % of the deviation from the mean


def test_pixel_stats_hand_computed_and_errors():
    images = np.array([[[0, 255], [255, 255]]], dtype=np.uint8)  # pixels 0, 1, 1, 1 after /255
    mean, std = pixel_stats(images)
    assert mean == pytest.approx(0.75) and std == pytest.approx(np.sqrt(0.1875))
    assert pixel_stats(np.full((2, 3, 3), 7, np.uint8))[1] == 1.0  # a constant set is not divided by 0
    with pytest.raises(ValueError, match="images must hold at least one pixel"):
        pixel_stats(np.zeros((0, 4, 4), np.uint8))
