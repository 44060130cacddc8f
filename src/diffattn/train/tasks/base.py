"""What every task provides to the trainer, and the registry of tasks.

A task is one registered unit (a :class:`Task` subclass declared with its ``name`` as a class keyword, which
registers it; one module per task under ``diffattn/train/tasks/``): its options (``Config``, a :class:`TaskConfig`
dataclass: the ``task:`` section of a recipe is parsed into it), its config checks (:meth:`Task.check_config`), its
data (:meth:`Task.dataset`), its loss and per-step hook (:meth:`Task.loss`, :meth:`Task.after_step`), its
validation (:meth:`Task.validate`, the metrics of :attr:`Task.metrics`) and its saves. :data:`TASKS` is the one
table of tasks; the trainer and the config look a task up there and never switch on its name."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.data import Dataset

from ...adapters import adapters, lambda_summary
from ...data.catalog import DATASETS
from ...errors import UsageError
from ...factory import released_layout, resolve_source, save_released
from ...io import atomic_write_dir
from ...layers import DiffAttention, GatedDiffAttention
from ...models import DiffattnModel
from ..data import to_device

__all__ = ["Task", "TaskConfig", "TASKS", "register_task", "check", "mean_lambdas", "check_tokens", "check_images",
           "check_labels", "model_vocab_size", "eval_batches", "merged_model"]


@dataclass
class TaskConfig:
    """The ``task:`` section of a recipe: ``name`` picks the task, whose own ``Config`` (a subclass of this one, a
    dataclass) holds the keys it reads: what a run records in ``config.yaml`` and what a resumed run must match."""

    name: str = "classify"


#: the one table of tasks: ``task.name`` → its :class:`Task` subclass, filled by :func:`register_task` (the package
#: :mod:`diffattn.train.tasks` imports every module of its folder, so a new task is one new file)
TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: add the task ``cls.name`` (its ``Config`` a :class:`TaskConfig` dataclass) to :data:`TASKS`.
    Registering a name again replaces the earlier task (a test's or a user's variant of a shipped one)."""
    if not (isinstance(cls.name, str) and cls.name):
        raise TypeError(f"task class {cls.__name__} must set name (the config's task.name)")
    if not (dataclasses.is_dataclass(cls.Config) and issubclass(cls.Config, TaskConfig)):
        raise TypeError(f"{cls.__name__}.Config must be a dataclass subclassing TaskConfig, got {cls.Config!r}")
    cls.options = tuple(f.name for f in dataclasses.fields(cls.Config))
    TASKS[cls.name] = cls
    return cls


def check(ok: bool, key: str, got: Any, need: str, hint: str = "") -> None:
    """Raise a :class:`UsageError` naming ``key``, what it must be and what it got (then ``hint``: "did you
    mean …?") unless ``ok``."""
    if not ok:
        raise UsageError(f"config {key} must be {need}, got {got!r}{hint}")


#: token ids read to find the largest id of a stream without a sidecar (the whole stream when it is shorter)
_MAX_SCAN = 1 << 26


def model_vocab_size(model: nn.Module) -> int | None:
    """The number of token ids ``model`` embeds: its input embedding's rows, else its ``vocab_size``."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
        except (NotImplementedError, AttributeError):
            emb = None
        if isinstance(emb, nn.Embedding):
            return int(emb.num_embeddings)
    v = getattr(model, "vocab_size", None)
    return int(v) if isinstance(v, int) else None


def _max_id(tokens) -> int:
    import numpy as np

    n = min(len(tokens), _MAX_SCAN)
    step = 1 << 22
    return max((int(np.asarray(tokens[i:min(i + step, n)]).max()) for i in range(0, n, step)), default=-1)


def check_tokens(windows, model: nn.Module, vocab_key: str | None) -> None:
    """The token stream of ``windows`` (a :class:`~diffattn.train.data.TokenWindows`) fits ``model``: its
    vocabulary (the token file's sidecar, else its largest id) is at most the model's, and ``data.block_size`` is at
    most the model's context. ``vocab_key`` names the config key that sets the model's vocabulary; None: nothing
    sets it (a released checkpoint, ``model.pretrained``), so the advice is data of the checkpoint's ids."""
    vocab = model_vocab_size(model)
    if vocab is None:
        return
    source = getattr(windows, "source", None) or "the training data"
    declared = getattr(windows, "vocab_size", None)
    fixed = (f"model.pretrained fixes the model's vocabulary (model.overrides cannot change it): give token ids "
             f"below {vocab}, a token file of the checkpoint's tokenizer (data.name=tokens, data.path=FILE)")
    if declared is not None and declared > vocab:
        fix = f"set {vocab_key} to at least {declared}, or tokenize the data for this model" if vocab_key else fixed
        raise UsageError(f"data.path {source} holds ids of a {declared}-token vocabulary (its sidecar says so), but "
                         f"the model embeds {vocab} ids; {fix}")
    top = _max_id(windows.tokens)
    if top >= vocab:
        fix = (f"set {vocab_key} to at least {top + 1}, or use data.tokenizer that matches the model" if vocab_key
               else fixed)
        raise UsageError(f"{source} holds token id {top}, but the model embeds {vocab} ids; {fix}")
    context = getattr(model, "max_seq_len", None)
    config = getattr(model, "config", None)
    if context is None and config is not None:
        context = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    if isinstance(context, int) and windows.block_size > context:
        raise UsageError(f"data.block_size {windows.block_size} exceeds the model's context of {context} positions")


def check_images(sample: torch.Tensor, vit: nn.Module, what: str) -> None:
    """One training image (C, H, W) has the channels and size the vision transformer ``vit`` takes."""
    pe = getattr(vit, "patch_embed", None)
    if pe is None or not isinstance(sample, torch.Tensor) or sample.dim() != 3:
        return
    size = pe.img_size if isinstance(pe.img_size, (tuple, list)) else (pe.img_size, pe.img_size)
    want = (pe.proj.in_channels, *size)
    if tuple(sample.shape) != tuple(want):
        raise UsageError(f"data.name {what!r} gives {'×'.join(map(str, sample.shape))} images (C×H×W), the model "
                         f"takes {'×'.join(map(str, want))}; set data.img_size or the model's img_size / in_chans "
                         f"(model.overrides)")


def check_labels(labels, num_classes: int | None, what: str) -> None:
    """Class labels lie in [0, num_classes)."""
    if labels is None or num_classes is None or not len(labels):
        return
    labels = torch.as_tensor(labels)
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= num_classes:
        raise UsageError(f"data.name {what!r} has class labels in [{lo}, {hi}], the model has num_classes="
                         f"{num_classes}; set model.overrides.num_classes to at least {hi + 1}")


@torch.no_grad()
def mean_lambdas(model: nn.Module) -> list[float]:
    """Mean λ of each differential attention layer, in module order (Ye et al. 2024, eq. 2's re-parameterised λ).
    Gated layers (M-DGSA) have an input-dependent gate instead and are left out; retrofitted layers report λ(t)."""
    out = []
    for m in model.modules():
        if isinstance(m, DiffAttention) and not isinstance(m, GatedDiffAttention):
            p = next(m.parameters())
            lam = m.lambda_weights(torch.zeros(1, 1, m.dim, device=p.device, dtype=p.dtype))[1]
            out.append(round(float(torch.as_tensor(lam, dtype=torch.float32).mean()), 5))
    if not out and adapters(model):
        out = [round(r["lambda"], 5) for r in lambda_summary(model)]
    return out


def save_model(model: nn.Module, folder: Path, training: str) -> None:
    """``model.save_pretrained(folder)``; a diffattn model's card says how it was trained."""
    if isinstance(model, DiffattnModel):
        model.save_pretrained(folder, model_card_kwargs={"training": training})
    else:
        model.save_pretrained(folder)


def merged_model(model: nn.Module) -> nn.Module:
    """``model`` itself, or for a peft model a copy with the LoRA weights merged in (the base model's class)."""
    if not hasattr(model, "merge_and_unload") or not hasattr(model, "peft_config"):
        return model
    import copy

    return copy.deepcopy(model).merge_and_unload()


def eval_batches(dataset: Dataset, batch_size: int, device: torch.device):
    """``(batch on device, its size)`` over ``dataset`` in order. No DataLoader: its iterator draws from the global
    RNG (and under torchrun broadcasts a seed), which a validation in the middle of a run must not do."""
    from torch.utils.data import default_collate

    for i in range(0, len(dataset), batch_size):
        items = [dataset[j] for j in range(i, min(i + batch_size, len(dataset)))]
        yield to_device(default_collate(items), device), len(items)


class Task:
    """A training task. A subclass sets ``name`` (the config's ``task.name``), ``Config`` (its options: a
    :class:`TaskConfig` dataclass), optionally ``metrics`` (what :meth:`validate` reports; the first is the default
    ``eval.metric``; empty: no validation while training), ``data_kinds`` / ``data_formats`` (the ``data.name``
    values it trains on) and ``model_name`` (whether ``model.name`` names a registered diffattn model; False: the
    task builds its own model in :meth:`own_model`), and implements :meth:`dataset` and :meth:`loss`. These class
    attributes may be given as class keywords; a ``name`` keyword registers the task (:func:`register_task`)::

        class LMTask(Task, name="lm", Config=LMConfig, metrics=("loss", "ppl"), data_kinds=("text",)):
            ...

    The trainer builds the run's model, once (:func:`diffattn.train.build.build_run_model`), and hands it to the
    task's hooks."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[TaskConfig]] = TaskConfig
    #: the keys of ``Config`` (set by :func:`register_task`)
    options: ClassVar[tuple[str, ...]] = ("name",)
    #: the metrics of :meth:`validate`, the first the default ``eval.metric``; () when the task has no validation
    metrics: ClassVar[tuple[str, ...]] = ()
    #: the kinds of :data:`diffattn.data.catalog.DATASETS` and the data formats ``data.name`` may name; both empty:
    #: ``data.name`` is not checked (the task reads its own data)
    data_kinds: ClassVar[tuple[str, ...]] = ()
    data_formats: ClassVar[tuple[str, ...]] = ()
    #: whether ``model.name`` must be a registered diffattn model (False: the task builds its model from ``task``)
    model_name: ClassVar[bool] = True
    #: the config keys that set the model's size (named when it cannot fit in memory)
    size_keys: ClassVar[str] = "model.overrides"
    #: whether ``model.pretrained`` (a released differential model: DiffLlama, Motif, a diffattn save or run) may
    #: start the run; the trained model is then also written in the checkpoint's own layout
    pretrained: ClassVar[bool] = False

    def __init_subclass__(cls, *, name: str | None = None, **attributes: Any) -> None:
        """Set the class attributes given as class keywords (``Config``, ``metrics``, ``data_kinds``, …); with a
        ``name``, register the task (:func:`register_task`). A subclass without a name registers nothing."""
        super().__init_subclass__()
        unknown = sorted(k for k in attributes if k not in _CLASS_KEYWORDS)
        if unknown:
            raise TypeError(f"task class {cls.__name__} got unknown class keyword(s) {unknown}; the keywords are "
                            f"name and {sorted(_CLASS_KEYWORDS)}")
        for key, value in attributes.items():
            setattr(cls, key, value)
        if name is not None:
            cls.name = name
            register_task(cls)

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    # ------------------------------------------------------------------------------------------- config

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """Check the values of ``cfg.task`` (types, ranges, choices) with :func:`check`; called by
        :func:`diffattn.train.config.validate`."""

    @classmethod
    def data_names(cls) -> list[str] | None:
        """The ``data.name`` values this task trains on (None: not checked)."""
        if not (cls.data_kinds or cls.data_formats):
            return None

        return sorted({*cls.data_formats, *(n for n, d in DATASETS.items() if d.kind in cls.data_kinds)})

    # -------------------------------------------------------------------------------------- model, data

    def own_model(self) -> nn.Module | None:
        """The task's own model, for a task whose model is not the ``model:`` section (a Hugging Face base it
        retrofits, PaliGemma, LLaVA's stages); None (the default): the trainer builds ``model:`` through the
        factory (:func:`diffattn.train.build.build_run_model`)."""
        return None

    def pretrained_dir(self) -> Path:
        """The local folder of ``model.pretrained`` (a hub id is downloaded once per run)."""
        if getattr(self, "_pretrained_dir", None) is None:
            self._pretrained_dir = resolve_source(self.cfg.model.pretrained)
        return self._pretrained_dir

    def dataset(self, model: nn.Module) -> Dataset:
        """The training set (``cfg.data``); sizes the data depend on (image size, tokenizer, vocabulary) are read
        from ``model``, the run's model (built once, before its data)."""
        raise NotImplementedError

    def check_data(self, model: nn.Module, dataset: Dataset) -> None:
        """Raise :class:`~diffattn.errors.UsageError` when ``dataset`` does not fit ``model`` (vocabulary, image
        size, number of classes); called before the first step, before the run directory is created."""

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        """The scalar loss of this rank's micro-batch (mean over its samples), computed under autocast."""
        raise NotImplementedError

    def after_step(self, model: nn.Module) -> None:
        """Called on the unwrapped model after every optimizer step (logit-scale clamp, λ schedule, …)."""

    # --------------------------------------------------------------------------------------- validation

    def val_dataset(self, model: nn.Module) -> Dataset:
        """The held-out set of ``eval``: this task's data with ``data.split = eval.split`` (and ``data.path =
        eval.path`` when given), at most ``eval.max_samples`` samples spread evenly over it."""
        e = self.cfg.eval
        data = dataclasses.replace(self.cfg.data, split=e.split, path=e.path or self.cfg.data.path)
        val = type(self)(dataclasses.replace(self.cfg, data=data)).dataset(model)
        if len(val) > e.max_samples:
            from torch.utils.data import Subset

            idx = torch.linspace(0, len(val) - 1, e.max_samples).round().long().unique().tolist()
            val = Subset(val, idx)
        if len(val) == 0:
            raise UsageError(f"eval.split {e.split!r} of data.name {self.cfg.data.name!r} is empty")
        return val

    @torch.no_grad()
    def validate(self, model: nn.Module, dataset: Dataset, device: torch.device,
                 amp_dtype: torch.dtype | None = None) -> dict[str, float]:
        """The task's quick evaluation of ``model`` (in eval mode) on ``dataset``: ``{metric: value}`` with the
        metrics of :attr:`metrics`. Draws no random numbers."""
        totals: dict[str, float] = {}
        count = 0
        for batch, n in eval_batches(dataset, self.cfg.eval.batch_size, device):
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                sums = self.val_sums(model, batch, n)
            for k, v in sums.items():
                totals[k] = totals.get(k, 0.0) + float(v)
            count += n
        return self.val_metrics(totals, count)

    def val_sums(self, model: nn.Module, batch, n: int) -> dict[str, float]:
        """Sums over one validation batch of ``n`` samples (default: the training loss times ``n``)."""
        return {"loss": float(self.loss(model, batch)) * n}

    def val_metrics(self, totals: dict[str, float], count: int) -> dict[str, float]:
        return {k: v / count for k, v in totals.items()}

    # ------------------------------------------------------------------------------------------- saving

    def save_initial(self, model: nn.Module, directory: Path) -> None:
        """Save what the run needs besides its final weights to be rebuilt from ``directory`` alone (called once,
        when a run starts, on rank 0)."""

    def final_saved(self, directory: Path) -> bool:
        """Whether :meth:`save_final` has written its result under ``directory``."""
        return (Path(directory) / "model" / "model.safetensors").is_file()

    def model_card(self) -> str:
        """What the saved model's card says about its training."""
        c = self.cfg
        budget = f"{c.run.steps} optimizer steps" if c.run.steps is not None else f"{c.run.epochs} epochs"
        return (f"Trained with `diffattn train` (task `{c.task.name}`, data `{c.data.name}`, {budget} of "
                f"{c.run.batch_size} samples, seed {c.run.seed}"
                f"{f', from `{c.model.pretrained}`' if c.model.pretrained else ''}"
                f"{', LoRA merged' if c.model.lora else ''}); the full config is `config.yaml` in the run "
                f"directory `{c.run.out}`.")

    def write_model(self, model: nn.Module, folder: Path) -> None:
        """Write the trained model's files into ``folder`` (a temporary folder swapped into place by the caller):
        ``save_pretrained``, LoRA merged into the weights; a run from ``model.pretrained`` also writes it in the
        checkpoint's own layout (``folder/diffllama``, ``folder/motif``: :func:`diffattn.factory.save_released`)."""
        model = merged_model(model)
        save_model(model, folder, self.model_card())
        if self.cfg.model.pretrained:
            source = self.pretrained_dir()
            save_released(model, released_layout(source), folder, source=source)

    def save_final(self, model: nn.Module, directory: Path) -> Path:
        """Save the trained model (:meth:`write_model`, atomically) under ``directory/model``."""
        target = Path(directory) / "model"
        with atomic_write_dir(target) as tmp:
            self.write_model(model, tmp)
        return target

    def save_best(self, model: nn.Module, directory: Path, record: dict) -> Path:
        """Save the model of the best validation so far as ``directory/best`` (:meth:`write_model`, plus
        ``best.json``: step, metric, value), atomically."""
        target = Path(directory) / "best"
        with atomic_write_dir(target) as tmp:
            self.write_model(model, tmp)
            (tmp / "best.json").write_text(json.dumps(record, indent=1))
        return target


#: the class attributes of :class:`Task` a subclass may give as class keywords (besides ``name``)
_CLASS_KEYWORDS = frozenset({"Config", "metrics", "data_kinds", "data_formats", "model_name", "size_keys",
                             "pretrained"})
