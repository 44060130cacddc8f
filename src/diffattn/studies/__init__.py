"""Studies: each paper's claim asked at a CPU size with several seeds, reported as mean ± std with paired tests.

    diffattn study diffclip    # CLIP vs DiffCLIP, DiffCLIP*, DiffCLIP† (Hammoud & Ghanem 2025, §4)
    diffattn study retrofit    # plain vs DAA / DiffQ / DiffK / DiffV (DAA 2025), DEX (Kong et al. 2025)
    diffattn study dgvit       # ViT vs DiffViT vs DGViT under noise and corruptions (M-DGSA 2025, §5.1)
    diffattn study noise       # answer vs context attention mass, standard vs differential LM (Ye et al. 2024)
    diffattn study paligemma   # LoRA vs shared-QK / split-heads + LoRA on a PaliGemma (Li et al. 2025)
    diffattn study needles     # multi-needle retrieval, standard vs Diff V1 / V2 / gated (Ye et al. 2024, §3.4)
    diffattn study recall      # multi-query associative recall at two widths (Arora et al. 2023, MQAR)

A study is a :class:`~diffattn.studies.base.Study` registered by name and a YAML config
(diffattn/configs/studies/<name>.yaml, :mod:`.config`) naming the variants, seeds and one budget; it trains every
variant at every seed through the library's train / eval / diagnostics code, saves each seed's results under
``<out>/seed<k>/`` (a finished seed is not recomputed) and aggregates them with :mod:`.report` into
``<out>/results.json`` and ``<out>/report.md``. A packaged study is the module ``diffattn.studies.<name>`` (found here
by name and imported on first use; one ``Study`` subclass) plus its YAML: no list to edit. What more than one study
runs is in :mod:`.common`. This is an application layer: only
``diffattn.cli`` imports it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from typing import Any

from ..configs import config_names
from ..deprecations import moved_attribute
from .base import Study, StudyConfig, add_study_loader, get_study, register_study, registered_studies
from .config import find_config, load_study, study_names, validate_study

__all__ = ["Study", "StudyConfig", "register_study", "get_study", "registered_studies", "study_names",
           "find_config", "load_study", "validate_study", "run_study"]


def _import_packaged(name: str) -> None:
    """Import the module ``diffattn.studies.<name>`` when this package has one: it registers its study."""
    if name in {m.name for m in pkgutil.iter_modules(__path__)}:
        importlib.import_module(f"{__name__}.{name}")


add_study_loader(_import_packaged)


def run_study(config: str | os.PathLike | dict, progress: bool = True) -> dict[str, Any]:
    """Run a study: ``config`` is a YAML path, a packaged study's name, or an already loaded mapping. Returns
    ``{"rows", "table", "seconds", "report", "results", "control"}`` (:func:`diffattn.studies.report.write_study`)."""
    cfg = validate_study(config, "the study config") if isinstance(config, dict | StudyConfig) else load_study(config)
    return get_study(cfg.study).execute(cfg, progress=progress)


#: ``STUDY_MODULES`` (packaged study name → ``diffattn.studies.<name>``), read with a warning: :func:`study_names`
__getattr__ = moved_attribute(__name__, {
    "STUDY_MODULES": lambda: {n: f"{__name__}.{n}" for n in config_names("studies")}})
