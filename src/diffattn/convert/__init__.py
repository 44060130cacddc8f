"""Exact conversion between diffattn and the formats users have weights in, one module per source format.

- :mod:`diffattn.convert.diffllama`: transformers' DiffLlama (halves layout) ↔ diffattn (adjacent layout), layer
  and model level (``from_diffllama``, ``to_diffllama``), keeping the source dtype.
- :mod:`diffattn.convert.timm`: ``timm.layers.DiffAttention`` ↔ ``diffattn.DiffAttention``; timm ViT checkpoints
  → ``VisionTransformer`` (``load_timm_vit``).
- :mod:`diffattn.convert.clip`: the DiffCLIP release, OpenAI CLIP and open_clip checkpoints → ``CLIP``.
- :mod:`diffattn.convert.unilm`: the official Diff Transformer V2 module (microsoft/unilm
  ``multihead_flashdiffv2.py``) ↔ ``DiffAttentionV2`` (``o_proj``/``out_proj``, ``lambda_proj``, interleaved or
  half RoPE), both ways.
- :mod:`diffattn.convert.motif`: the released Motif-2.6B (differential attention) and Motif-2-12.7B (grouped
  differential attention) checkpoints ↔ ``MotifLM`` (``from_motif``, ``to_motif``), both ways.
- :mod:`diffattn.convert.stable_audio`: Stable Audio 3's fused projection in Stability's layout ↔ diffusers', and
  diffusers' ``StableAudio3SelfAttention`` / ``StableAudio3CrossAttention`` ↔ ``StableAudioAttention``, both ways.
- :mod:`diffattn.convert.checkpoint`: reading files without executing code (safetensors, ``weights_only`` pickles,
  TorchScript archives such as OpenAI's released CLIP ``.pt`` files).

Every converter checks each key and shape and raises ``ValueError`` naming what is missing, empty, unexpected or
inexpressible; every loader bounds sizes before building anything and loads strictly.
"""

from . import checkpoint, clip, diffllama, motif, stable_audio, timm, unilm
from .checkpoint import *  # noqa: F403 (each module's public names are those of its __all__, listed there once)
from .clip import *  # noqa: F403
from .diffllama import *  # noqa: F403
from .motif import *  # noqa: F403
from .stable_audio import *  # noqa: F403
from .timm import *  # noqa: F403
from .unilm import *  # noqa: F403

__all__ = [*checkpoint.__all__, *clip.__all__, *diffllama.__all__, *motif.__all__, *timm.__all__, *unilm.__all__,
           *stable_audio.__all__]
