"""diffattn: differential attention for PyTorch.

Differential attention computes two softmax maps and subtracts one from the other, O = (A1 − λ A2) V, to cancel
attention noise (Ye et al. 2024). This package has every variant of the seed papers as drop-in layers with O(N)
memory backends and a fused Triton kernel, retrofits of pretrained Hugging Face, timm and open_clip models, and
models (DiffCLIP, DiffViT/DGViT, text classifiers, causal LMs). See README.md.

Importing ``diffattn`` registers its vision models with timm (``timm.create_model("diff_vit_tiny_patch16_224")``).
"""

from . import convert, functional, lambdas, layers, models
from .adapters import from_pretrained_retrofit, load_adapter, retrofit, save_adapter
from .data import get_dataset, list_datasets
from .formats import FormatMigrationWarning
from .functional import AttentionWeights, attention, diff_attention
from .layers import Attention, DiffAttention, DiffAttentionV2, GatedDiffAttention, KVCache, SwiGLU, attention_class
from .models import create_model, from_pretrained, list_models, list_pretrained
from .openclip import create_model_and_transforms, create_model_from_pretrained, get_tokenizer

__version__ = "0.1.0"

__all__ = [
    "functional",
    "lambdas",
    "layers",
    "convert",
    "models",
    "AttentionWeights",
    "attention",
    "diff_attention",
    "Attention",
    "DiffAttention",
    "GatedDiffAttention",
    "DiffAttentionV2",
    "KVCache",
    "SwiGLU",
    "attention_class",
    "retrofit",
    "save_adapter",
    "load_adapter",
    "from_pretrained_retrofit",
    "create_model",
    "list_models",
    "list_pretrained",
    "from_pretrained",
    "create_model_and_transforms",
    "create_model_from_pretrained",
    "get_tokenizer",
    "data",
    "get_dataset",
    "list_datasets",
    "FormatMigrationWarning",
    "__version__",
]
