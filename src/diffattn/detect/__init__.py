"""Differential attention inside Ultralytics YOLO detectors (needs the optional extra ``diffattn[detect]``).

Ultralytics is AGPL-3.0; it is never a dependency of the core library. Importing this package imports it and
registers the differential modules with Ultralytics' model-YAML parser (:func:`register`)::

    from diffattn.detect import yolo
    model = yolo("yolo26n-diffattn")            # an ultralytics.YOLO
    model.train(data="data.yaml", imgsz=160, epochs=10, **OFFLINE_TRAIN_ARGS)

- :class:`DiffAttention2d` (YAML name ``DiffAttention2d``): differential attention over the flattened feature map;
- :class:`DiffPSAAttention`: the differential form of Ultralytics' ``Attention``, used by :class:`DiffC2PSA` and
  :class:`DiffC3k2` (YAML names ``DiffC2PSA``, ``DiffC3k2``);
- :data:`MODEL_YAMLS`: ``yolo26{n,s}-diffattn`` and ``yolo26{n,s}-diffpsa``;
- a built or pretrained YOLO's own attention converts with ``diffattn.retrofit(model.model, "daa")``.
"""

from __future__ import annotations

from .offline import offline_env

offline_env()

try:
    import ultralytics  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("diffattn.detect needs ultralytics (AGPL-3.0): pip install 'diffattn[detect]'") from e

from .maps import attention_layers, attention_maps  # noqa: E402
from .modules import DiffAttention2d, DiffC2PSA, DiffC3k2, DiffPSAAttention, make_psa_differential  # noqa: E402
from .offline import OFFLINE_TRAIN_ARGS, OFFLINE_VAL_ARGS, disable_sync  # noqa: E402
from .registry import MODEL_YAMLS, YAML_MODULES, model_yaml, register, yolo  # noqa: E402
from .retrofit import retrofit_trainer  # noqa: E402

register()

__all__ = ["DiffAttention2d", "DiffPSAAttention", "DiffC2PSA", "DiffC3k2", "make_psa_differential", "MODEL_YAMLS",
           "YAML_MODULES", "model_yaml", "register", "yolo", "OFFLINE_TRAIN_ARGS", "OFFLINE_VAL_ARGS",
           "offline_env", "disable_sync", "attention_layers", "attention_maps", "retrofit_trainer"]
