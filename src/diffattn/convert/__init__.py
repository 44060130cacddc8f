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

from .checkpoint import read_checkpoint, read_torchscript, state_dict_of
from .clip import (
    clip_image_tower,
    convert_diffclip_state_dict,
    convert_openai_clip_state_dict,
    load_diffclip,
    load_diffclip_image_tower,
    load_open_clip,
    load_openai_clip,
)
from .diffllama import (
    adjacent_to_halves_perm,
    diffattn_to_diffllama_state_dict,
    diffllama_to_diffattn_state_dict,
    from_diffllama,
    from_diffllama_attention,
    halves_to_adjacent_perm,
    permute_heads,
    to_diffllama,
    to_diffllama_attention,
    to_diffllama_state_dict,
)
from .motif import (
    MOTIF_ARCHITECTURE,
    diffattn_to_motif_state_dict,
    from_motif,
    motif_config,
    motif_kwargs,
    motif_to_diffattn_state_dict,
    read_motif,
    to_motif,
)
from .stable_audio import (
    diffusers_to_stability_qkv,
    diffusers_to_stability_state_dict,
    from_diffusers_stable_audio,
    stability_to_diffusers_qkv,
    stability_to_diffusers_state_dict,
    to_diffusers_stable_audio,
)
from .timm import (
    convert_timm_vit_state_dict,
    diffattn_to_timm_state_dict,
    from_timm_diff_attention,
    load_timm_vit,
    timm_to_diffattn_state_dict,
    to_timm_diff_attention,
)
from .unilm import (
    diffattn_to_unilm_v2_state_dict,
    from_unilm_v2,
    half_to_interleaved_perm,
    interleaved_to_half_perm,
    permute_head_channels,
    to_unilm_v2_state_dict,
    unilm_rel_pos,
    unilm_v2_to_diffattn_state_dict,
)

__all__ = [
    "read_checkpoint",
    "read_torchscript",
    "state_dict_of",
    "convert_diffclip_state_dict",
    "convert_openai_clip_state_dict",
    "load_diffclip",
    "clip_image_tower",
    "load_diffclip_image_tower",
    "load_open_clip",
    "load_openai_clip",
    "adjacent_to_halves_perm",
    "halves_to_adjacent_perm",
    "permute_heads",
    "diffllama_to_diffattn_state_dict",
    "diffattn_to_diffllama_state_dict",
    "from_diffllama_attention",
    "to_diffllama_attention",
    "from_diffllama",
    "to_diffllama",
    "to_diffllama_state_dict",
    "MOTIF_ARCHITECTURE",
    "motif_kwargs",
    "motif_to_diffattn_state_dict",
    "diffattn_to_motif_state_dict",
    "motif_config",
    "read_motif",
    "from_motif",
    "to_motif",
    "timm_to_diffattn_state_dict",
    "diffattn_to_timm_state_dict",
    "from_timm_diff_attention",
    "to_timm_diff_attention",
    "convert_timm_vit_state_dict",
    "load_timm_vit",
    "interleaved_to_half_perm",
    "half_to_interleaved_perm",
    "permute_head_channels",
    "unilm_v2_to_diffattn_state_dict",
    "diffattn_to_unilm_v2_state_dict",
    "from_unilm_v2",
    "to_unilm_v2_state_dict",
    "unilm_rel_pos",
    "stability_to_diffusers_qkv",
    "diffusers_to_stability_qkv",
    "stability_to_diffusers_state_dict",
    "diffusers_to_stability_state_dict",
    "from_diffusers_stable_audio",
    "to_diffusers_stable_audio",
]
