"""Studies: each paper's claim asked at a CPU size with several seeds, reported as mean ± std with paired tests.

    diffattn study diffclip    # CLIP vs DiffCLIP, DiffCLIP*, DiffCLIP† (Hammoud & Ghanem 2025, §4)
    diffattn study retrofit    # plain vs DAA / DiffQ / DiffK / DiffV (DAA 2025), DEX (Kong et al. 2025)
    diffattn study dgvit       # ViT vs DiffViT vs DGViT under noise and corruptions (M-DGSA 2025, §5.1)
    diffattn study noise       # answer vs context attention mass, standard vs differential LM (Ye et al. 2024)
    diffattn study paligemma   # LoRA vs shared-QK / split-heads + LoRA on a PaliGemma (Li et al. 2025)
    diffattn study needles     # multi-needle retrieval, standard vs Diff V1 / V2 / gated (Ye et al. 2024, §3.4)
    diffattn study recall      # multi-query associative recall at two widths (Arora et al. 2023, MQAR)

A study is a YAML config (diffattn/configs/studies/<name>.yaml, :mod:`.config`) naming the variants, seeds and one
budget; its module trains every variant at every seed through the library's train / eval / diagnostics code, saves each
seed's results under ``<out>/seed<k>/`` (a finished seed is not recomputed) and aggregates them with
:mod:`.report` into ``<out>/results.json`` and ``<out>/report.md``. This is an application layer: only
``diffattn.cli`` imports it.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from .config import STUDY_MODULES, find_config, load_study, validate_study

__all__ = ["STUDY_MODULES", "find_config", "load_study", "validate_study", "run_study"]


def run_study(config: str | os.PathLike | dict, progress: bool = True) -> dict[str, Any]:
    """Run a study: ``config`` is a YAML path, a packaged study's name, or an already loaded mapping. Returns
    ``{"rows", "table", "seconds", "report", "results", "control"}`` (:func:`diffattn.studies.report.write_study`)."""
    cfg = validate_study(config, "the study config") if isinstance(config, dict) else load_study(config)
    module = importlib.import_module(STUDY_MODULES[cfg["study"]])
    return module.run(cfg, progress=progress)
