"""Data for the trainer: a deterministic, resumable batch order and the datasets the recipes read.

The batch order is a pure function of (seed, optimizer step): step s of epoch e = s // steps_per_epoch takes
the s-th slice of ``randperm(n, seed + e)`` as its GLOBAL batch, then splits it into ``accum_steps`` micro-batches
and each micro-batch over the ranks in rank order. So the same config gives the same global batches on 1 or N
processes, and resuming at step s needs nothing but s (the data position of an exact resume).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, TensorDataset

from ..data import DatasetNotInstalledError, get_dataset, read_token_meta, tokenize_documents
from ..data.transforms import pixel_stats
from ..errors import UsageError
from ..models import Vocabulary

__all__ = ["StepBatchSampler", "local_batch_size", "digits_dataset", "digit_caption_dataset", "TokenWindows",
           "byte_tokens", "sklearn_text_tokens", "text_classification_dataset", "to_device", "external_dataset",
           "ImageLabels", "ImageCaptions", "text_windows", "image_transform", "train_split_stats"]


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (a tensor, or lists, tuples and dicts of them) moved to ``device``; anything else unchanged. What
    the loop and the recipes' evaluation both use, so it lives here rather than in either of them."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGIT_TEMPLATES = ("a photo of the digit {}.", "a handwritten {}.", "the number {}, written by hand.",
                   "a scan of a {}.", "a small blurry {}.")


def local_batch_size(batch_size: int, world_size: int, accum_steps: int) -> int:
    """Global ``batch_size`` / (world_size · accum_steps); a remainder is a ``ValueError``."""
    div = world_size * accum_steps
    if batch_size % div:
        raise ValueError(f"run.batch_size (the global batch) must be divisible by world_size × run.accum_steps = "
                         f"{world_size} × {accum_steps} = {div}, got {batch_size}")
    return batch_size // div


class StepBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches (lists of indices) for optimizer steps ``start_step`` … ``total_steps − 1``.

    ``len(dataset) // batch_size`` steps make an epoch (the last partial batch is dropped)."""

    def __init__(self, n: int, batch_size: int, *, world_size: int = 1, rank: int = 0, accum_steps: int = 1,
                 seed: int = 0, start_step: int = 0, total_steps: int) -> None:
        self.micro = local_batch_size(batch_size, world_size, accum_steps)
        if n < batch_size:
            raise ValueError(f"the dataset has {n} samples, fewer than run.batch_size = {batch_size}")
        self.n, self.batch_size, self.world_size, self.rank = n, batch_size, world_size, rank
        self.accum_steps, self.seed, self.start_step, self.total_steps = accum_steps, seed, start_step, total_steps
        self.steps_per_epoch = n // batch_size

    def global_batch(self, step: int) -> torch.Tensor:
        """The indices of optimizer step ``step``'s global batch, (batch_size,)."""
        epoch, i = divmod(step, self.steps_per_epoch)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(self.n, generator=g)
        return perm[i * self.batch_size:(i + 1) * self.batch_size]

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start_step, self.total_steps):
            parts = self.global_batch(step).view(self.accum_steps, self.world_size, self.micro)  # (A, W, b)
            for a in range(self.accum_steps):
                yield parts[a, self.rank].tolist()

    def __len__(self) -> int:
        return (self.total_steps - self.start_step) * self.accum_steps


# ------------------------------------------------------------------------------------------------ images


def _digits_arrays(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1,797 real 8×8 digit scans (UCI), standardised; ``train``/``test`` a fixed 75/25 split."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    cut = int(0.75 * len(y))
    idx = {"train": perm[:cut], "test": perm[cut:], "all": perm}.get(split)
    if idx is None:
        raise ValueError(f"data.split for digits must be 'train', 'test' or 'all', got {split!r}")

    mean, std = pixel_stats(get_dataset("digits", split="train").images)  # the statistics `diffattn eval` uses
    x = (x - mean) / std
    return x[idx], y[idx]


def digits_dataset(split: str = "train", img_size: int | None = None) -> TensorDataset:
    """(image (1, S, S), label) pairs of the digits; ``img_size`` resizes from 8 (bilinear)."""
    x, y = _digits_arrays(split)
    if img_size and img_size != 8:
        x = torch.nn.functional.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
    return TensorDataset(x, y)


def digit_caption_dataset(tokenizer, split: str = "train", img_size: int | None = None,
                          in_chans: int = 1) -> TensorDataset:
    """(image, tokens) pairs: each digit scan with a caption naming it ("a handwritten seven.", five templates)."""
    x, y = digits_dataset(split, img_size).tensors
    if in_chans != 1:
        x = x.expand(-1, in_chans, -1, -1).contiguous()
    captions = [DIGIT_TEMPLATES[i % len(DIGIT_TEMPLATES)].format(DIGIT_NAMES[int(c)]) for i, c in enumerate(y)]
    tokens = torch.as_tensor(tokenizer(captions))
    return TensorDataset(x, tokens)


# ------------------------------------------------------------------------------------------------ tokens


class TokenWindows(Dataset):
    """Non-overlapping windows of ``block_size + 1`` tokens of a 1-D token stream (nanoGPT's memmap format:
    a flat array of ids, e.g. ``uint16``); item i → (input (block_size,), target (block_size,)) shifted by one."""

    def __init__(self, tokens: np.ndarray, block_size: int) -> None:
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be a 1-D stream, got shape {tokens.shape}")
        if len(tokens) < block_size + 1:
            raise ValueError(f"the token stream has {len(tokens)} tokens, fewer than data.block_size + 1 = "
                             f"{block_size + 1}")
        self.tokens, self.block_size = tokens, block_size
        self.source: str | None = None  # the token file, when read from one
        self.vocab_size: int | None = None  # the vocabulary its sidecar declares

    @classmethod
    def from_file(cls, path: str | os.PathLike, block_size: int, dtype: str = "uint16") -> TokenWindows:
        if not Path(path).is_file():
            raise FileNotFoundError(f"data.path {str(path)!r} does not exist (a token memmap: a flat {dtype} array)")

        try:
            meta = read_token_meta(path)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"the sidecar of data.path {str(path)!r} is not valid JSON ({e})") from None
        width = np.dtype(dtype).itemsize
        size = Path(path).stat().st_size
        if size % width:
            raise ValueError(f"data.path {str(path)!r} has {size} bytes, not a multiple of {width} (data.dtype "
                             f"{dtype!r})")
        if isinstance(meta, dict) and meta.get("dtype") not in (None, dtype):
            raise ValueError(f"data.path {str(path)!r} holds {meta['dtype']} ids (its sidecar says so), data.dtype is "
                             f"{dtype!r}; set data.dtype={meta['dtype']}")
        windows = cls(np.memmap(path, dtype=np.dtype(dtype), mode="r"), block_size)
        windows.source = str(path)
        vocab = meta.get("vocab_size") if isinstance(meta, dict) else None
        windows.vocab_size = int(vocab) if isinstance(vocab, int) and not isinstance(vocab, bool) else None
        return windows

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = i * self.block_size
        w = torch.from_numpy(np.asarray(self.tokens[s:s + self.block_size + 1]).astype(np.int64))
        return w[:-1], w[1:]


def byte_tokens(text: str) -> np.ndarray:
    """UTF-8 bytes as token ids (vocabulary 256)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def sklearn_text_tokens() -> np.ndarray:
    """Byte-level tokens of the English dataset descriptions scikit-learn ships (≈100 kB of real prose)."""
    import sklearn.datasets

    folder = Path(sklearn.datasets.__file__).parent / "descr"
    files = sorted(folder.glob("*.rst"))
    if not files:
        raise ValueError(f"no dataset descriptions under {folder}")
    return byte_tokens("\n\n".join(f.read_text(encoding="utf-8") for f in files))


# ------------------------------------------------------------------------------------------ labelled texts


def text_classification_dataset(name: str, split: str = "train", *, root: str | os.PathLike | None = None,
                                vocab_size: int, block_size: int, min_freq: int = 2):
    """(ids (L,), mask (L,), label) triples of a labelled text set of ``diffattn.data.get_dataset`` (items
    ``{"text", "label", ...}``, e.g. ``spamassassin``), and the :class:`~diffattn.models.Vocabulary` that encoded them.

    The vocabulary is built from the ``train`` split only, whatever ``split`` is read (words seen ``min_freq``
    times, the ``vocab_size`` most frequent counting ``<pad>``/``<unk>``; M-DGSA 2025, App. B.3, Table 5), so it is
    deterministic and never sees held-out text. Texts are truncated and right-padded to ``block_size`` tokens; mask
    is 1 for tokens, 0 for padding. Returns ``(TensorDataset(ids, mask, labels), vocabulary)``.
    """

    train = get_dataset(name, split="train", root=root)
    texts = getattr(train, "texts", None)
    if texts is None:
        raise ValueError(f"data.name {name!r} is not a text set (its items have no 'text'); a text classifier "
                         f"needs one whose items are {{'text', 'label'}}, e.g. 'spamassassin'")
    vocab = Vocabulary.build(texts, min_freq=min_freq, max_size=vocab_size)
    base = train if split == "train" else get_dataset(name, split=split, root=root)
    if split != "train":
        texts = base.texts
    docs = getattr(base, "documents", None) or [base[i] for i in range(len(base))]
    if docs and "label" not in docs[0]:
        raise ValueError(f"data.name {name!r} has no 'label' per item; task 'classify' needs labelled texts")
    ids, mask = vocab.encode_batch(texts, block_size, padding="max_length")  # (N, L) each
    labels = torch.tensor([int(d["label"]) for d in docs], dtype=torch.long)
    return TensorDataset(ids, mask, labels), vocab


def steps_for(cfg_run, n: int) -> int:
    """Total optimizer steps: ``run.steps`` or ``ceil(run.epochs · (n // batch_size))``."""
    if cfg_run.steps is not None:
        return int(cfg_run.steps)
    return max(1, math.ceil(cfg_run.epochs * (n // cfg_run.batch_size)))


def external_dataset(cfg) -> Dataset:
    """``diffattn.data.get_dataset(data.name, split=data.split, root=data.path)``, each error naming the data keys;
    a task shapes its samples (:class:`ImageLabels`, :class:`ImageCaptions`, :func:`text_windows`)."""

    d = cfg.data
    where = f"data.name {d.name!r}" + (f", data.path {d.path!r}" if d.path else "")
    try:
        return get_dataset(d.name, split=d.split, root=d.path)
    except DatasetNotInstalledError as e:
        if d.path is None:
            raise
        raise DatasetNotInstalledError(f"{where}: {e}") from None
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{where}: {e}") from None
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None


def image_transform(size: int, chans: int, mean: float = 0.5, std: float = 0.5):
    """PIL image → (chans, size, size) tensor, standardised with one ``mean``/``std`` for all channels."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize((size, size)),
        transforms.Grayscale(1) if chans == 1 else transforms.Lambda(lambda im: im.convert("RGB")),
        transforms.ToTensor(), transforms.Normalize([mean] * chans, [std] * chans)])


def train_split_stats(base, cfg) -> tuple[float, float]:
    """Pixel mean/std of the train split for sets that expose their images as an array (Fashion-MNIST, digits):
    the statistics ``diffattn eval`` standardises with, so training and evaluation see the same inputs. Other
    sets keep the [-1, 1] scaling."""
    if getattr(base, "images", None) is None:
        return 0.5, 0.5

    train = base if cfg.data.split == "train" else get_dataset(cfg.data.name, split="train", root=cfg.data.path)
    return pixel_stats(train.images)


def _image_and_target(item) -> tuple[Any, Any]:
    """(image, caption or label) of a ``diffattn.data`` sample: a dict or a pair."""
    if isinstance(item, dict):
        return item["image"], item.get("caption", item.get("category"))
    return item


class ImageLabels(Dataset):
    """(image tensor, label) of a ``diffattn.data`` image set; ``transform`` turns a PIL image into a tensor."""

    def __init__(self, base, transform) -> None:
        self.base, self.transform = base, transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        image, target = _image_and_target(self.base[i])
        return (image if isinstance(image, torch.Tensor) else self.transform(image)), int(target)


class ImageCaptions(Dataset):
    """(image tensor, caption tokens) of a ``diffattn.data`` caption set, tokenised with ``tokenizer``."""

    def __init__(self, base, transform, tokenizer) -> None:
        self.base, self.transform, self.tokenizer = base, transform, tokenizer

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        image, target = _image_and_target(self.base[i])
        image = image if isinstance(image, torch.Tensor) else self.transform(image)
        return image, torch.as_tensor(self.tokenizer([target]))[0]


def text_windows(base, data) -> TokenWindows:
    """LM windows of a ``diffattn.data`` text set (``.texts``): ``data.tokenizer`` ids (``bytes``: UTF-8 bytes),
    ``data.block_size`` tokens."""
    texts = getattr(base, "texts", None)
    if texts is None:
        raise ValueError(f"data.name {data.name!r} is not a text set (no .texts); a language model needs one")
    if data.tokenizer == "bytes":
        tokens = byte_tokens("\n\n".join(texts))
    else:
        tokens = np.asarray(tokenize_documents(texts, data.tokenizer))
    return TokenWindows(tokens, data.block_size)
