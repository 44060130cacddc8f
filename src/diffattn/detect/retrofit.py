"""Fine-tune a retrofitted YOLO with Ultralytics' own trainer: :func:`retrofit_trainer`.

Ultralytics' ``model.train()`` builds a fresh model from the YAML (with the dataset's class count) and copies the
weights over by name, so a retrofitted module would come back as a plain ``Attention``. The trainer class returned
by :func:`retrofit_trainer` builds that fresh model, retrofits it with the same
:class:`~diffattn.adapters.RetrofitConfig`, copies every adapter's weights and schedule step, and advances λ(t)
(DAA (2025) eq. 3) once per optimizer step, in the model and in its EMA copy (whose integer ``step`` buffers
Ultralytics' EMA would otherwise leave at their start).
"""

from __future__ import annotations

from dataclasses import replace

import torch.nn as nn
from ultralytics.models.yolo.detect import DetectionTrainer

from ..adapters import adapters, retrofit, retrofit_config, step

__all__ = ["retrofit_trainer"]


def _copy_adapters(src: nn.Module, dst: nn.Module) -> None:
    want = dict(adapters(src))
    for name, a in adapters(dst):
        a.load_state_dict(want[name].state_dict())


def retrofit_trainer(model: nn.Module) -> type[DetectionTrainer]:
    """A ``DetectionTrainer`` subclass for ``yolo.train(trainer=...)`` that trains the retrofit of ``model``
    (``yolo.model`` after :func:`diffattn.retrofit`). Ultralytics makes every parameter trainable, whatever the
    retrofit's ``train`` mode; use ``freeze=`` to freeze layers."""
    config = retrofit_config(model)  # ValueError when model is not retrofitted

    class RetrofitDetectionTrainer(DetectionTrainer):
        def get_model(self, cfg=None, weights=None, verbose=True):
            fresh = super().get_model(cfg=cfg, weights=model, verbose=verbose)  # pretrained weights, by name
            retrofit(fresh, replace(config, train="all"))  # Ultralytics trains every parameter anyway
            _copy_adapters(model, fresh)
            return fresh

        def optimizer_step(self):
            super().optimizer_step()
            step(self.model)
            if self.ema is not None:
                for (_, a), (_, b) in zip(adapters(self.model), adapters(self.ema.ema), strict=True):
                    b.step_buffer.copy_(a.step_buffer)

    return RetrofitDetectionTrainer
