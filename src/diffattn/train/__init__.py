"""Training: one loop for every task (CLIP, classification, causal LM, retrofit fine-tuning), recipes, torchrun
(DDP / FSDP2), atomic checkpoints and exact resume. Part of the application layer: nothing in the library
(ops … models, losses, data) imports it.

    from diffattn.train import load_config, train
    train(load_config("tiny/clip", ["optim.lr=3e-4"]), out="runs/clip", resume="auto")
"""

from .config import TrainConfig, load_config
from .loop import train

__all__ = ["TrainConfig", "load_config", "train"]
