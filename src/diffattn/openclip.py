"""open_clip's model API for diffattn's CLIP family, and its training script on diffattn models.

open_clip (Ilharco et al. 2021) builds models with ``create_model_and_transforms(name, pretrained)`` →
``(model, preprocess_train, preprocess_val)`` and tokenizers with ``get_tokenizer(name)``; its models take
``model(image, text)`` and, built with ``output_dict=True``, return ``{"image_features", "text_features",
"logit_scale"}`` (features L2-normalised, (B, E); logit_scale = exp(t), a scalar), which its ``ClipLoss`` takes as
keyword arguments. This module gives diffattn's CLIP models (``clip_*``, ``diffclip_*``, ``dgclip_*``; see
``diffattn.list_models("*clip*")``) the same functions with the same return shapes, so code written for open_clip
runs on them, and :func:`patch_open_clip_train` lets open_clip's own training script (``open_clip_train.main``)
build them by name:

    diffattn openclip-train --model diffclip_tiny --train-data pairs.csv --dataset-type csv ...

runs ``open_clip_train.main`` with every diffattn name built by diffattn (other names still go to open_clip).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch

from .factory import create_model
from .models.clip import CLIP, image_transform
from .models.pretrained import split_model_tag
from .models.registry import is_model, list_models, model_config, model_family

__all__ = ["create_model_and_transforms", "create_model_from_pretrained", "get_tokenizer", "patch_open_clip_train",
           "is_clip_model", "main"]

_PRECISIONS = {"fp32": None, "amp": None, "amp_bf16": None, "amp_bfloat16": None, "fp16": torch.float16,
               "pure_fp16": torch.float16, "bf16": torch.bfloat16, "pure_bf16": torch.bfloat16,
               "fp64": torch.float64}


def is_clip_model(name: str) -> bool:
    """True when ``name`` (or ``"name.tag"``) is a registered diffattn model of the CLIP family."""
    if not isinstance(name, str):
        return False
    base, _ = split_model_tag(name)
    return is_model(base) and issubclass(model_family(base).cls, CLIP)


def _check_clip(name: str) -> str:
    base, _ = split_model_tag(name)
    if not is_clip_model(name):
        raise ValueError(f"{name!r} is not a diffattn CLIP model; these are: "
                         f"{[n for n in _all_names() if is_clip_model(n)]}")
    return base


def _all_names() -> list[str]:
    return list_models()


def _unsupported(**options) -> None:
    """open_clip options diffattn cannot honour: each must be at its 'off' value."""
    bad = {k: v for k, v in options.items() if v not in (None, False, 0, 0.0, "", {}, ())}
    if bad:
        raise ValueError(f"open_clip options not supported by diffattn's CLIP models: {bad}")


def get_tokenizer(model_name: str, context_length: int | None = None, cache_dir=None, **kwargs):
    """open_clip's ``get_tokenizer``: CLIP's byte-level BPE (open_clip's bundled ``SimpleTokenizer``, offline) with
    the model's context length (or ``context_length``). ``tokenizer(texts)`` → int64 (B, context_length), EOT the
    largest id (49407), zero padded, as open_clip's. ``cache_dir`` is accepted for open_clip's signature (unused)."""
    from open_clip.tokenizer import SimpleTokenizer

    base = _check_clip(model_name)
    _unsupported(**kwargs)
    length = context_length or model_config(base)["text"]["context_length"]
    return SimpleTokenizer(context_length=length)


def _transforms(model: CLIP, image_mean, image_std):
    cfg = model.visual.pretrained_cfg  # the weights' preprocessing when loaded with pretrained=TAG
    mean = tuple(image_mean) if image_mean is not None else tuple(cfg["mean"])
    std = tuple(image_std) if image_std is not None else tuple(cfg["std"])
    return (image_transform(model.img_size, train=True, mean=mean, std=std),
            image_transform(model.img_size, train=False, mean=mean, std=std))


def create_model_and_transforms(model_name: str, pretrained: str | None = None, *, precision: str = "fp32",
                                device: str | torch.device = "cpu", jit: bool = False,
                                force_image_size: int | None = None, force_context_length: int | None = None,
                                image_mean=None, image_std=None, image_interpolation: str | None = None,
                                image_resize_mode: str | None = None, aug_cfg=None, output_dict: bool | None = None,
                                cache_dir=None, force_quick_gelu: bool = False, force_custom_text: bool = False,
                                force_patch_dropout: float | None = None, pretrained_image: bool = False,
                                load_weights: bool = True, pretrained_hf: bool = True,
                                load_weights_only: bool = True, force_preprocess_cfg=None,
                                **model_kwargs) -> tuple[CLIP, object, object]:
    """open_clip's ``create_model_and_transforms`` for diffattn's CLIP models: ``(model, preprocess_train,
    preprocess_val)``.

    ``model_name`` is a diffattn CLIP name (``"diffclip_tiny"``) or ``"name.tag"``; ``pretrained`` a tag of
    :func:`diffattn.list_pretrained` or a local file (``None`` or ``""``: random init). The model is in train mode
    (as open_clip's), on ``device``, in the dtype of ``precision`` (``fp32`` and the ``amp*`` modes keep float32,
    ``fp16``/``bf16``/``pure_*`` cast the weights). ``output_dict=True`` makes ``model(image, text)`` return
    ``{"image_features", "text_features", "logit_scale"}``; ``False`` or ``None`` the tuple of the same three, as
    open_clip's models. The transforms are DiffCLIP's (Hammoud & Ghanem 2025, §4.1; the SLIP recipe): train =
    RandomResizedCrop(scale 0.5–1, bicubic) → tensor → normalise, val = Resize(shorter side, bicubic) →
    CenterCrop → tensor → normalise, each image (3, S, S) float32 with S the model's image size; mean/std are the
    weights' (ImageNet's for random init) unless ``image_mean``/``image_std`` are given.
    ``force_image_size`` and ``force_context_length`` set the towers' sizes (random init only);
    ``model_kwargs`` are :func:`diffattn.create_model` overrides (``init_logit_scale=`` as open_clip's). Options
    that change open_clip's own architecture (``force_quick_gelu``, ``force_custom_text``, ``jit``,
    ``pretrained_image``, a logit bias) or its augmentation (``aug_cfg``, another interpolation or resize mode)
    raise ``ValueError`` instead of being ignored."""
    base, tag = split_model_tag(model_name)
    base = _check_clip(model_name)
    if tag is not None and pretrained not in (None, "", tag):
        raise ValueError(f"model_name {model_name!r} names tag {tag!r}, but pretrained={pretrained!r}")
    pretrained = tag or pretrained or None
    _unsupported(jit=jit, force_quick_gelu=force_quick_gelu, force_custom_text=force_custom_text,
                 force_patch_dropout=force_patch_dropout, pretrained_image=pretrained_image,
                 aug_cfg=dict(aug_cfg or {}), force_preprocess_cfg=force_preprocess_cfg,
                 init_logit_bias=model_kwargs.pop("init_logit_bias", None))
    if image_interpolation not in (None, "bicubic"):
        raise ValueError(f"image_interpolation={image_interpolation!r}: diffattn's CLIP transforms are bicubic")
    if image_resize_mode not in (None, "shortest"):
        raise ValueError(f"image_resize_mode={image_resize_mode!r}: diffattn's eval transform resizes the shortest "
                         f"side and center-crops ('shortest')")
    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(_PRECISIONS)}, got {precision!r}")
    if not load_weights:
        pretrained = None
    if force_image_size is not None:
        model_kwargs["vision_img_size"] = int(force_image_size if not isinstance(force_image_size, (tuple, list))
                                              else force_image_size[0])
    if force_context_length is not None:
        model_kwargs["text_context_length"] = int(force_context_length)
    if pretrained is not None:
        if force_image_size is not None or force_context_length is not None:
            raise ValueError("force_image_size / force_context_length change the towers and cannot load pretrained "
                             "weights")
        model_kwargs.update(pretrained=pretrained, cache_dir=cache_dir)
    model = create_model(base, **model_kwargs)
    dtype = _PRECISIONS[precision]
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device=device)
    model.output_dict = bool(output_dict)
    model.train()
    preprocess_train, preprocess_val = _transforms(model, image_mean, image_std)
    return model, preprocess_train, preprocess_val


def create_model_from_pretrained(model_name: str, pretrained: str | None = None, *, return_transform: bool = True,
                                 **kwargs):
    """open_clip's ``create_model_from_pretrained``: ``(model, preprocess_val)`` (or the model alone with
    ``return_transform=False``), the model in eval mode; keywords as :func:`create_model_and_transforms`."""
    model, _, preprocess = create_model_and_transforms(model_name, pretrained, **kwargs)
    model.eval()
    return (model, preprocess) if return_transform else model


@contextlib.contextmanager
def patch_open_clip_train() -> Iterator[None]:
    """Within the block, open_clip's training script (``open_clip_train.main``, ``open_clip_train.zero_shot``)
    builds diffattn's CLIP models by name: its ``create_model_and_transforms`` and ``get_tokenizer`` go to this
    module for every diffattn CLIP name and to open_clip for every other. Restored on exit."""
    import open_clip_train.main as oc_main
    import open_clip_train.zero_shot as oc_zero_shot

    saved = {(m, n): getattr(m, n) for m in (oc_main, oc_zero_shot)
             for n in ("create_model_and_transforms", "get_tokenizer") if hasattr(m, n)}

    def route(name: str, theirs):
        ours = {"create_model_and_transforms": create_model_and_transforms, "get_tokenizer": get_tokenizer}[name]

        def call(model_name, *args, **kwargs):
            return (ours if is_clip_model(model_name) else theirs)(model_name, *args, **kwargs)

        call.__name__ = name
        return call

    try:
        for (module, name), fn in saved.items():
            setattr(module, name, route(name, fn))
        yield
    finally:
        for (module, name), fn in saved.items():
            setattr(module, name, fn)


def main(argv: list[str] | None = None):
    """``diffattn openclip-train ARGS``: open_clip's ``open_clip_train.main.main(ARGS)`` with diffattn's CLIP
    models available by name (:func:`patch_open_clip_train`). Returns what open_clip's ``main`` returns."""
    from open_clip_train.main import main as oc_main

    with patch_open_clip_train():
        return oc_main(sys.argv[1:] if argv is None else argv)

