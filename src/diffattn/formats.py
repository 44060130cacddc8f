"""The diffattn format version of saved files, and the migrations that load older files with their old meaning.

Every ``config.json`` written by ``save_pretrained`` and every ``diffattn_adapter.json`` written by ``save_adapter``
records ``diffattn_format`` (the integer :data:`FORMAT`) and ``diffattn_version`` (the package version). The format
number changes whenever the meaning of a saved configuration or tensor changes: the same file would otherwise
compute something else. Files without the entry were written by diffattn 0.1.0 (or by the code that followed it
before format 1 existed) and are format 0.

A loader reads the format with :func:`read_format`: a file from a newer format than this code knows is a
:class:`FormatVersionError` naming the file, its format and the supported one. An older file goes through
:func:`migrate`, which applies every registered :class:`Migration` from the file's format up to :data:`FORMAT` to
the file's configuration and state dict (copies), and emits one :class:`FormatMigrationWarning` saying what it
changed; the loaded object then computes exactly what the saved one computed, and saving it again writes the
current format (no warning on the next load).

Formats:

- 0: diffattn 0.1.0 (no ``diffattn_format`` entry; adapters recorded ``format_version: 1``).
- 1: ``DiffAttention(lambda_form="token_sigmoid")`` (and :class:`GatedDiffAttention` with that form) has no
  sub-norm and λ = σ(X W) without bias by default, the form of the Differential Transformer V2 (Ye et al. 2026,
  microsoft/unilm ``multihead_flashdiffv2.py``): 0.1.0 had no sub-norm but a bias, σ(X W + b); the code between
  0.1.0 and format 1 had the RMSNorm × (1 − λ_init) sub-norm and no bias. The migration keeps each file's own
  form: ``lambda_options={"bias": True}`` where the file holds ``lambda_proj.bias``, ``sub_norm=True`` where it
  holds the sub-norm (for models: every token_sigmoid model of format 0, since 0.1.0 models had no λ form option).
  Kept through the 0.2 series; removed in 0.3.0 (format-0 files then load after one save with a 0.2 release).

Which loader reads a path: :func:`saved_kind` tells the kinds of saved paths apart (a training run, a
``save_pretrained`` folder, an adapter, a transformers checkpoint, …) from their marker files alone, so every loader's
error on a path of the wrong kind names the call that loads it (:func:`wrong_kind`).

This module imports nothing from diffattn, so every layer of the package may use it.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .deprecations import user_stacklevel

__all__ = ["FORMAT", "FORMAT_KEY", "VERSION_KEY", "KINDS", "FormatMigrationWarning", "FormatVersionError",
           "Migration", "MIGRATIONS", "read_format", "check_format", "migrate", "saved_kind", "wrong_kind",
           "SERVE_MODEL_TYPE", "is_diffattn_config"]

FORMAT = 1
FORMAT_KEY = "diffattn_format"
VERSION_KEY = "diffattn_version"
KINDS = ("model", "layer", "adapter")


class FormatMigrationWarning(UserWarning):
    """A file of an older diffattn format was loaded with its old meaning; the message says what was changed."""


class FormatVersionError(ValueError):
    """A file was written by a newer diffattn format than this code reads."""


@dataclass(frozen=True)
class Migration:
    """One change of meaning, from format ``source`` to ``source + 1``.

    ``apply(kind, config, state_dict)`` edits ``config`` and ``state_dict`` in place (copies owned by
    :func:`migrate`) so that the current code builds an object that computes what format ``source`` computed, and
    returns one sentence per change it made (none: the file was not affected). ``kind`` is one of :data:`KINDS`:
    a model's constructor arguments, a layer's (``{"attention": name, **kwargs}``) or an adapter's JSON record.
    """

    source: int
    name: str
    apply: Callable[[str, dict[str, Any], dict[str, Any]], list[str]]


def _configs(kind: str, config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, dict of attention arguments) of a configuration: the layer's own, or a model's top level and its
    nested tower configurations (CLIP's ``vision`` and ``text``)."""
    out = [("", config)]
    if kind == "model":
        out += [(f"{k}: ", v) for k, v in config.items() if isinstance(v, dict)]
    return out


#: the attention kinds, as format-0 configs name them, whose sub-norm default followed the λ form
_FORMAT_0_SUB_NORM_KINDS = frozenset({"diff", "gated"})


def _token_sigmoid_defaults(kind: str, config: dict[str, Any], state_dict: dict[str, Any]) -> list[str]:
    """Format 0 → 1: the defaults of the ``token_sigmoid`` λ form in :class:`DiffAttention` and
    :class:`GatedDiffAttention` became those of Diff Transformer V2 (no sub-norm, no bias)."""
    if kind not in ("model", "layer"):
        return []
    changes = []
    for where, cfg in _configs(kind, config):
        if cfg.get("lambda_form") != "token_sigmoid" or cfg.get("attention") not in _FORMAT_0_SUB_NORM_KINDS:
            continue  # standard attention ignores the form; DiffAttentionV2's defaults did not change
        if cfg.get("sub_norm") is None:
            # 0.1.0's layers had no sub-norm with this form (they hold no diff_norm tensor); the code after it had
            # one, and 0.1.0's models had no lambda_form option, so a format-0 model with this form is of that code
            if kind == "model" or "diff_norm.weight" in state_dict:
                cfg["sub_norm"] = True
                changes.append(f"{where}token_sigmoid attention keeps the RMSNorm × (1 − λ_init) sub-norm it was "
                               f"saved with (sub_norm=True; the default is now no sub-norm)")
            elif cfg.get("sub_norm_affine") is False:  # a sub-norm without weight leaves no tensor to tell by
                changes.append(f"{where}token_sigmoid attention is loaded without sub-norm, as diffattn 0.1.0 "
                               f"built it; the code after 0.1.0 had an RMSNorm × (1 − λ_init) there, which "
                               f"sub_norm_affine=False leaves no tensor of: pass sub_norm=True if it saved this")
        if kind == "layer":
            options = cfg.get("lambda_options") or {}
            if "bias" not in options and "lambda_fn.lambda_proj.bias" in state_dict:
                cfg["lambda_options"] = {**options, "bias": True}
                changes.append(f"{where}token_sigmoid λ keeps the bias it was saved with, λ = σ(X W + b) "
                               f"(lambda_options={{'bias': True}}; the default is now σ(X W))")
    return changes


def _lambda_std_option(kind: str, config: dict[str, Any], state_dict: dict[str, Any]) -> list[str]:
    """Format 0 → 1: 0.1.0's ``DiffAttention(lambda_std=...)`` (the reparam vectors' initial std) is now the
    λ form's option ``lambda_options={"std": ...}``; it sets only the initialisation, so this is not a change of
    meaning and is not reported."""
    if kind == "layer" and "lambda_std" in config:
        std = config.pop("lambda_std")
        if config.get("lambda_form", "reparam") == "reparam":
            config["lambda_options"] = {"std": std, **(config.get("lambda_options") or {})}
    return []


MIGRATIONS: tuple[Migration, ...] = (
    Migration(0, "token_sigmoid defaults (sub-norm, bias)", _token_sigmoid_defaults),
    Migration(0, "lambda_std as a λ option", _lambda_std_option),
)


def check_fields(cls: type, data: Any, noun: str = "fields") -> None:
    """Raise a ValueError unless ``data`` is a JSON object whose keys are all fields of the dataclass ``cls`` (what a
    saved configuration's ``from_dict`` reads); the message names the unknown keys and lists the ``noun``."""
    if not isinstance(data, Mapping):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise ValueError(f"{article} {cls.__name__} needs a JSON object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} {noun} {unknown}; the {noun} are {sorted(names)}")


def check_format(value: Any, what: str, version: Any = None) -> int:
    """``value`` as a format number this code reads, or an error naming ``what`` (the file), its format and the
    supported one: :class:`FormatVersionError` for a newer format, ValueError for a value that is not one."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} has {FORMAT_KEY} {value!r}; it must be an integer >= 0 (this diffattn writes "
                         f"format {FORMAT})")
    if value > FORMAT:
        by = f" by diffattn {version}" if isinstance(version, str) else ""
        raise FormatVersionError(f"{what} was written{by} in diffattn format {value}; this diffattn reads formats "
                                 f"0 to {FORMAT}: upgrade diffattn to load it")
    return value


def read_format(record: Mapping[str, Any], what: str) -> int:
    """The format of a saved JSON record (``config.json``, ``diffattn_adapter.json``): its ``diffattn_format``
    entry, or 0 without one; checked with :func:`check_format`."""
    if FORMAT_KEY not in record:
        return 0
    return check_format(record[FORMAT_KEY], what, record.get(VERSION_KEY))


def migrate(kind: str, config: Mapping[str, Any], state_dict: Mapping[str, Any], *, source: int,
            what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config, state_dict) of a format-``source`` file as the current code reads them, with one
    :class:`FormatMigrationWarning` naming ``what`` and every change when a migration changed anything.

    ``config`` is copied deeply and ``state_dict`` shallowly (its tensors are shared, not copied); the arguments are
    not modified. ``source`` = :data:`FORMAT` returns the copies unchanged.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    source = check_format(source, what)
    config, state_dict = copy.deepcopy(dict(config)), dict(state_dict)
    changes: list[str] = []
    for m in MIGRATIONS:
        if source <= m.source < FORMAT:
            changes += m.apply(kind, config, state_dict)
    if changes:
        then = (f"Saving it again writes format {FORMAT} with these settings" if kind != "layer" else
                f"Build the layer with these arguments to load its state dict as format {FORMAT}")
        warnings.warn(FormatMigrationWarning(
            f"{what} was written in diffattn format {source}; loaded with its saved meaning (format {FORMAT} "
            f"changed it): " + "; ".join(changes) + f". {then}."), stacklevel=user_stacklevel())
    return config, state_dict


# ------------------------------------------------------------------------------------- which loader reads a path

#: the file extensions of single checkpoint files (state dicts)
_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


def _json_object(path) -> dict | None:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def saved_kind(path) -> tuple[str, str] | None:
    """What ``path`` holds and the call that loads it: ``(description, call)``, or None when it is none of
    diffattn's saves nor a checkpoint diffattn converts. Reads marker files only (``retrofit.json``,
    ``config.yaml``, ``config.json``, ``diffattn_adapter.json``, ``state.pt``), never weights."""
    from pathlib import Path

    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix in _CHECKPOINT_SUFFIXES:
            return ("a checkpoint file", "diffattn.create_model(name, pretrained=path) for a diffattn model's "
                    "weights, or a diffattn.convert loader (load_timm_vit, load_diffclip, load_openai_clip, "
                    "read_checkpoint)")
        if p.name == "config.json":
            kind = saved_kind(p.parent)
            return ("the config.json of " + kind[0], kind[1].replace("(path)", "(path.parent)")) if kind else None
        return None
    if not p.is_dir():
        return None
    if (p / "retrofit.json").is_file():
        return "a retrofit training run (retrofit.json)", "diffattn.load_run(path)"
    if (p / "config.yaml").is_file() and any((p / d).is_dir() for d in ("model", "best", "checkpoints")):
        return "a diffattn training run (config.yaml)", "diffattn.load_run(path)"
    if (p / "state.pt").is_file() and p.parent.name == "checkpoints":
        return ("a training checkpoint (state.pt)", f"diffattn.load_run({str(p.parent.parent)!r}) (the run's final "
                "model), or diffattn train … --resume path")
    if (p / "diffattn_adapter.json").is_file():
        return ("a diffattn adapter folder (diffattn_adapter.json)", "diffattn.load_adapter(base_model, path) onto "
                "the base model it was saved from")
    cfg = _json_object(p / "config.json") if (p / "config.json").is_file() else None
    if cfg is None:
        return None
    arch = cfg.get("architecture")
    if is_diffattn_config(cfg):
        return "a diffattn save_pretrained folder", "diffattn.from_pretrained(path) or diffattn.load_run(path)"
    serve = cfg.get("model_type") == SERVE_MODEL_TYPE  # a diffattn causal LM's config, its architecture malformed
    ours = serve or "architectures" not in cfg
    names = arch if ours else cfg.get("architectures")
    names = names if isinstance(names, list) else [names]
    shown = f"{'architecture' if ours else 'architectures'} {names!r}"
    if "diffattn_retrofit" in cfg:
        return (f"a transformers checkpoint of a retrofitted model ({shown})",
                "diffattn.from_pretrained_retrofit(path) or diffattn.load_run(path)")
    if cfg.get("model_type") == "diffllama" or any(isinstance(n, str) and n.startswith("DiffLlama") for n in names):
        return f"a transformers DiffLlama checkpoint ({shown})", "diffattn.convert.from_diffllama(path)"
    if str(cfg.get("model_type")).lower() == "motif" or any(isinstance(n, str) and n.startswith("Motif")
                                                           for n in names):  # the released files say "Motif"
        return f"a Motif checkpoint ({shown})", "diffattn.convert.from_motif(path)"
    if not serve and ("model_type" in cfg or "architectures" in cfg):
        return (f"a transformers checkpoint ({shown})", "transformers' AutoModelForCausalLM.from_pretrained(path) "
                "(or the Auto class of its task), then diffattn.retrofit(model, method)")
    return None


#: the ``model_type`` of a diffattn ``config.json`` that also names a vLLM architecture (``architectures``): causal
#: LMs write both, so that vLLM with diffattn's plugin (:mod:`diffattn.serve`) serves the folder as it is
SERVE_MODEL_TYPE = "diffattn"


def is_diffattn_config(cfg: Mapping[str, Any]) -> bool:
    """Whether a ``config.json`` object was written by diffattn's ``save_pretrained``: it names a diffattn class in
    ``architecture`` and has no transformers ``architectures`` list, unless its ``model_type`` is
    :data:`SERVE_MODEL_TYPE` (a causal LM, which lists its vLLM architecture there too)."""
    return isinstance(cfg.get("architecture"), str) and (
        "architectures" not in cfg or cfg.get("model_type") == SERVE_MODEL_TYPE)


def wrong_kind(path, want: str) -> str | None:
    """``"{path} is <what it holds>, not {want}; load it with <call>"``, or None when :func:`saved_kind` does not
    know what ``path`` holds (the caller then says what it needs)."""
    kind = saved_kind(path)
    if kind is None:
        return None
    return f"{path} is {kind[0]}, not {want}; load it with {kind[1]}"
