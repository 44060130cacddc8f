"""diffattn: differential attention for PyTorch.

Layers and the operator (Ye et al. 2024; DiffCLIP; M-DGSA), O(N)-memory backends, retrofits of pretrained models,
models, training and evaluation. See README.md.
"""

from . import functional, lambdas, layers
from .functional import AttentionWeights, attention, diff_attention
from .layers import Attention, DiffAttention, GatedDiffAttention, KVCache, SwiGLU

__version__ = "0.1.0"

__all__ = [
    "functional",
    "lambdas",
    "layers",
    "AttentionWeights",
    "attention",
    "diff_attention",
    "Attention",
    "DiffAttention",
    "GatedDiffAttention",
    "KVCache",
    "SwiGLU",
    "__version__",
]
