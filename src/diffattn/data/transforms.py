"""Image transforms: the CLIP recipe's, timm's classifier transforms, and ImageNet-C corruptions.

* :func:`clip_transform`: DiffCLIP's preprocessing (Hammoud & Ghanem 2025, §4.1 and its released code): training
  ``RandomResizedCrop(size, scale=(0.5, 1.0))``, evaluation ``Resize(size)`` + ``CenterCrop(size)``, both bicubic,
  RGB, normalised with the ImageNet mean and standard deviation.
* :func:`classifier_transform`: ``timm.data.create_transform`` (the ViT / DGViT recipes).
* :class:`Corruption`: one of the 19 ImageNet-C corruptions at severity 1–5 (Hendrycks & Dietterich 2019), from
  ``imagecorruptions-imaug`` (the original ``imagecorruptions`` no longer imports with current scikit-image).
"""

from __future__ import annotations

import numpy as np

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "clip_transform", "classifier_transform", "Corruption",
           "corruption_names", "pixel_stats"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: the smallest side ImageNet-C's corruption functions accept
MIN_SIZE = 32


def _to_rgb(image):
    return image.convert("RGB") if getattr(image, "mode", "RGB") != "RGB" else image


def clip_transform(image_size: int = 224, train: bool = False, *, scale: tuple[float, float] = (0.5, 1.0),
                   mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD):
    """PIL image → (3, image_size, image_size) float tensor: the CLIP training (``train=True``) or evaluation
    transform of Hammoud & Ghanem 2025 (§4.1, released code): RandomResizedCrop with ``scale`` (0.5–1), or
    Resize + CenterCrop."""
    from torchvision import transforms as T

    if not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    if not (0.0 < scale[0] <= scale[1] <= 1.0):
        raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {scale!r}")
    bicubic = T.InterpolationMode.BICUBIC
    if train:
        resize = [T.RandomResizedCrop(image_size, scale=scale, interpolation=bicubic)]
    else:
        resize = [T.Resize(image_size, interpolation=bicubic), T.CenterCrop(image_size)]
    return T.Compose([*resize, T.Lambda(_to_rgb), T.ToTensor(), T.Normalize(mean, std)])


def pixel_stats(images: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation of uint8 pixels scaled to [0, 1], one value over every pixel and channel.

    The statistics with which the classifier recipes standardise images: training (``diffattn train``, task
    ``classify``) and evaluation (``diffattn eval``) both compute them on the **train** split, so a model is
    evaluated on exactly the inputs it was trained on. A constant image set gets std 1.
    """
    images = np.asarray(images)
    if images.size == 0:
        raise ValueError("images must hold at least one pixel to compute mean and std, got an empty array")
    x = images.astype(np.float64) / 255.0
    std = float(x.std())
    return float(x.mean()), std if std > 0 else 1.0


def classifier_transform(input_size: int = 224, train: bool = False, **kwargs):
    """timm's ``create_transform(input_size, is_training=train, **kwargs)`` (RandAugment etc. through kwargs)."""
    from timm.data import create_transform

    return create_transform(input_size, is_training=train, **kwargs)


def corruption_names() -> list[str]:
    """The 19 ImageNet-C corruption names (15 benchmark + 4 held-out)."""
    from imagecorruptions import get_corruption_names

    return list(get_corruption_names("all"))


class Corruption:
    """``Corruption(name, severity)(image)`` → the corrupted PIL RGB image (Hendrycks & Dietterich 2019, §3).

    Images smaller than 32 px (Fashion-MNIST's 28×28) are corrupted at a bicubic upscale to 32 px and scaled
    back, since the corruption functions need 32 px. Deterministic for a given ``seed``: the noise corruptions
    draw from NumPy's global generator, reseeded per call from ``seed`` and a call counter (and restored after).
    """

    def __init__(self, name: str, severity: int = 3, seed: int | None = 0) -> None:
        names = corruption_names()
        if name not in names:
            raise ValueError(f"name must be one of {names}, got {name!r}")
        if not isinstance(severity, int) or isinstance(severity, bool) or not 1 <= severity <= 5:
            raise ValueError(f"severity must be an int in 1..5, got {severity!r}")
        self.name, self.severity, self.seed, self._calls = name, severity, seed, 0

    def __call__(self, image):
        from imagecorruptions import corrupt
        from PIL import Image

        arr = np.asarray(_to_rgb(image) if hasattr(image, "convert") else image)
        if arr.ndim == 2:
            arr = np.repeat(arr[..., None], 3, axis=-1)
        if arr.ndim != 3 or arr.shape[-1] != 3 or arr.dtype != np.uint8:
            raise ValueError(f"image must be a PIL image or an (H, W, 3) uint8 array, got shape {arr.shape} "
                             f"dtype {arr.dtype}")
        h, w = arr.shape[:2]
        small = min(h, w) < MIN_SIZE
        if small:  # ImageNet-C's corruptions need 32 px: corrupt a bicubic upscale, then scale back
            k = MIN_SIZE / min(h, w)
            arr = np.asarray(Image.fromarray(arr).resize((max(MIN_SIZE, round(w * k)), max(MIN_SIZE, round(h * k))),
                                                         Image.Resampling.BICUBIC))
        state = None
        if self.seed is not None:
            state = np.random.get_state()
            np.random.seed((self.seed * 1_000_003 + self._calls) % 2**32)
            self._calls += 1
        try:
            out = corrupt(arr, corruption_name=self.name, severity=self.severity)
        finally:
            if state is not None:
                np.random.set_state(state)
        out = Image.fromarray(np.uint8(np.clip(out, 0, 255))[..., :3])
        return out.resize((w, h), Image.Resampling.BICUBIC) if small else out

    def __repr__(self) -> str:
        return f"Corruption({self.name!r}, severity={self.severity})"
