"""Differential attention inside Ultralytics YOLO detectors (needs the optional extra ``diffattn[detect]``).

Ultralytics is AGPL-3.0; it is never a dependency of the core library. Importing this package imports nothing and
changes nothing: the names below are resolved on first access (PEP 562), and what diffattn does to Ultralytics
happens in explicit calls. :func:`offline_env` (``YOLO_OFFLINE=1``, no online probe) must run before Ultralytics is
first imported; :func:`yolo` registers the differential modules with Ultralytics' model-YAML parser
(:func:`register`) itself::

    from diffattn import detect
    detect.offline_env()                        # before anything imports ultralytics
    model = detect.yolo("yolo26n-diffattn")     # an ultralytics.YOLO
    model.train(data="data.yaml", imgsz=160, epochs=10, **detect.OFFLINE_TRAIN_ARGS)

- :class:`DiffAttention2d` (YAML name ``DiffAttention2d``): differential attention over the flattened feature map;
- :class:`DiffPSAAttention`: the differential form of Ultralytics' ``Attention``, used by :class:`DiffC2PSA` and
  :class:`DiffC3k2` (YAML names ``DiffC2PSA``, ``DiffC3k2``);
- :data:`MODEL_YAMLS`: ``yolo26{n,s}-diffattn`` and ``yolo26{n,s}-diffpsa``;
- a built or pretrained YOLO's own attention converts with ``diffattn.retrofit(model.model, "daa")``.

The detection comparison is a study: ``diffattn study detection`` (:mod:`diffattn.studies.detection`).
"""

from __future__ import annotations

import importlib

__all__ = ["DiffAttention2d", "DiffPSAAttention", "DiffC2PSA", "DiffC3k2", "make_psa_differential", "MODEL_YAMLS",
           "YAML_MODULES", "model_yaml", "register", "yolo", "OFFLINE_TRAIN_ARGS", "OFFLINE_VAL_ARGS",
           "offline_env", "disable_sync", "attention_layers", "attention_maps", "retrofit_trainer"]

#: public name -> the submodule that defines it, by full name so that the import-cycle check sees it (``offline``
#: imports no Ultralytics; the others do)
_LAZY = {
    **dict.fromkeys(("attention_layers", "attention_maps"), "diffattn.detect.maps"),
    **dict.fromkeys(("DiffAttention2d", "DiffC2PSA", "DiffC3k2", "DiffPSAAttention", "make_psa_differential"),
                    "diffattn.detect.modules"),
    **dict.fromkeys(("OFFLINE_TRAIN_ARGS", "OFFLINE_VAL_ARGS", "disable_sync", "offline_env"),
                    "diffattn.detect.offline"),
    **dict.fromkeys(("MODEL_YAMLS", "YAML_MODULES", "model_yaml", "register", "yolo"), "diffattn.detect.registry"),
    "retrofit_trainer": "diffattn.detect.retrofit",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _LAZY[name]
    if module != "diffattn.detect.offline":
        try:
            import ultralytics  # noqa: F401
        except ImportError as e:  # pragma: no cover - exercised only without the extra
            raise ImportError("diffattn.detect needs ultralytics (AGPL-3.0): pip install 'diffattn[detect]'") from e
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
