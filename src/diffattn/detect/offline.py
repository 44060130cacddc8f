"""Run Ultralytics with no network access: the settings that stop every download and upload.

What Ultralytics would otherwise fetch or send, and what stops it:

- the online probe (DNS lookups at import): the environment variable ``YOLO_OFFLINE=1``, set before ultralytics is
  imported (:func:`offline_env`), makes ``ultralytics.utils.ONLINE`` False;
- analytics and hub sync (events sent after each run): the setting ``sync=False`` (:func:`disable_sync`);
- the Arial fonts for plots (downloaded by ``check_font`` when labels or results are drawn): ``plots=False``;
- the AMP check (it downloads ``yolo26n.pt`` to compare outputs): ``amp=False`` (CPU runs never use AMP anyway);
- pretrained weights: build from a YAML (``yolo26n.yaml``, :data:`diffattn.detect.MODEL_YAMLS`), never ``*.pt`` by
  name, and train with ``pretrained=False``;
- datasets: a ``data.yaml`` whose ``path`` is a local folder (:func:`diffattn.data.detection.export_detection`);
  with ``download`` absent, a missing dataset is an error, never a download.

:data:`OFFLINE_TRAIN_ARGS` holds the ``model.train()`` / ``model.val()`` keywords.
"""

from __future__ import annotations

import os

__all__ = ["OFFLINE_TRAIN_ARGS", "OFFLINE_VAL_ARGS", "offline_env", "disable_sync"]

#: keywords for ``model.train()`` that keep Ultralytics offline and deterministic on CPU
OFFLINE_TRAIN_ARGS: dict = {"plots": False, "amp": False, "pretrained": False, "device": "cpu", "workers": 0,
                            "deterministic": True, "verbose": False, "exist_ok": True}
#: keywords for ``model.val()`` that keep Ultralytics offline
OFFLINE_VAL_ARGS: dict = {"plots": False, "device": "cpu", "workers": 0, "verbose": False}


def offline_env() -> None:
    """Set ``YOLO_OFFLINE=1`` (no online probe) unless the user set it; effective when ultralytics is imported
    after this call, and also marks an already imported ultralytics offline."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    import sys

    utils = sys.modules.get("ultralytics.utils")
    if utils is not None and os.environ["YOLO_OFFLINE"] not in ("0", "false", "False"):
        utils.ONLINE = False


def disable_sync() -> None:
    """Turn off Ultralytics' analytics / hub sync for this process (its ``settings`` object, ``sync=False``;
    Ultralytics persists settings in its config folder, ``$YOLO_CONFIG_DIR`` if set)."""
    from ultralytics.utils import SETTINGS

    if SETTINGS.get("sync", True):
        SETTINGS.update({"sync": False})
