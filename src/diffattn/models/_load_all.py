"""Imports every model module so that their registrations run. Add new model modules here."""

import importlib

for _name in ("vit", "clip", "text", "causal_lm", "vlm"):
    try:
        importlib.import_module(f"{__package__}.{_name}")
    except ModuleNotFoundError as e:  # a module that is not written yet
        if e.name != f"{__package__}.{_name}":
            raise
