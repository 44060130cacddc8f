"""Training configuration: dataclasses loaded from YAML, with ``--set section.key=value`` overrides.

A run is described by five sections, and an optional sixth for validation while it trains::

    task:  {name: a registered task (diffattn.train.tasks.TASKS), ...that task's options (its Config)}
    model: {name: a registered model (``diffattn models``), overrides: {...create_model keyword arguments}}
           or {pretrained: a released differential model (folder or hub id), dtype, lora, lora_r, lora_alpha,
           lora_targets, freeze_lambda}
    data:  {name: a dataset, path: files a user supplies, ...}
    optim: {lr, weight_decay, betas, warmup_steps, min_lr_ratio, grad_clip}
    run:   {steps | epochs, batch_size (GLOBAL), accum_steps, seed, device, precision, distributed, checkpoints,
            logging}
    eval:  {every, metric, split, path, max_samples, batch_size}

An unknown key is a :class:`~diffattn.errors.UsageError` (a ``ValueError``) naming the key and the valid ones (for
``task``: the keys of the named task's ``Config``); a YAML syntax error names the file, line and column.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..checks import is_int
from ..configs import apply_sets, config_names, find_config
from ..deprecations import warn_deprecated
from ..directions import higher_is_better
from ..errors import UsageError, did_you_mean, yaml_error
from ..models import is_model, list_models
from ..utils import check_device
from .tasks import TASKS, task_keys
from .tasks.base import Task, TaskConfig, check

__all__ = ["TaskConfig", "ModelConfig", "DataConfig", "OptimConfig", "RunConfig", "EvalConfig", "TrainConfig",
           "load_config", "apply_overrides", "config_from_dict", "val_metric",
           "RESUMABLE_KEYS", "BUDGET_KEYS", "digest_hash", "run_config_dict", "config_digest"]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
STRATEGIES = ("ddp", "fsdp2")


#: the linear layers of diffattn's causal LMs (DiffLlama and Motif checkpoints convert to these names)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "gate_proj", "up_proj", "down_proj"]
DTYPES = ("float32", "bfloat16")


@dataclass
class ModelConfig:
    """``name``: a registered diffattn model; ``overrides``: keyword arguments for ``create_model``.

    Or ``pretrained``: a released differential model to start from (a folder or a Hugging Face Hub id holding a
    DiffLlama checkpoint, a Motif checkpoint, a diffattn ``save_pretrained`` folder or a diffattn run; for the
    tasks that take one, :attr:`~diffattn.train.tasks.Task.pretrained`), trained in ``dtype`` (its weights are cast
    to it; ``overrides`` may then set only ``attention.backend``). ``lora`` trains peft LoRA (``lora_r``,
    ``lora_alpha``, ``lora_targets``: the spelling of the retrofit task's) instead of every weight;
    ``freeze_lambda`` keeps the re-parameterised λ vectors (Ye et al. 2024, eq. 2) as loaded (else they train, with
    LoRA too)."""

    name: str = ""
    overrides: dict = field(default_factory=dict)
    pretrained: str | None = None
    dtype: str = "float32"
    lora: bool = False
    lora_r: int = 32
    lora_alpha: int = 64
    lora_targets: list = field(default_factory=lambda: list(LORA_TARGETS))
    freeze_lambda: bool = False

    def check(self, task: type[Task]) -> None:
        """The section's values for ``task``: a registered ``name`` where the task builds its model from this
        section (or ``pretrained``, where it takes one), ``overrides`` a mapping, and the start of the run
        (:meth:`check_start`)."""
        _check(not task.model_name or bool(self.name) or bool(self.pretrained), "model.name", self.name,
               "a registered model name (list them with `diffattn models`)" +
               (", or give model.pretrained" if task.pretrained else ""))
        _check(isinstance(self.overrides, dict), "model.overrides", self.overrides, "a mapping")
        self.check_start(task)
        if self.name and task.model_name and not self.pretrained:
            _check(is_model(self.name), "model.name", self.name,
                   "a registered model name (list them with `diffattn models`)", did_you_mean(self.name, list_models()))

    def check_start(self, task: type[Task]) -> None:
        """``pretrained``, ``dtype``, ``lora*`` and ``freeze_lambda``: where ``task`` takes them, and their values.
        λ_init is not among them: a released checkpoint's λ_init is fixed by the layer index (DiffLlama's and
        Motif's schedules), another one changes the function it computes and cannot be written back in its
        layout."""
        default = ModelConfig()
        start = {k: getattr(self, k) for k in ("pretrained", "lora", "freeze_lambda")
                 if getattr(self, k) != getattr(default, k)}
        if self.pretrained is not None:
            _check(isinstance(self.pretrained, str) and bool(self.pretrained), "model.pretrained", self.pretrained,
                   "a folder or a Hugging Face Hub id (org/name)")
            _check(task.pretrained, "model.pretrained", self.pretrained,
                   f"null for task {task.name!r} (a released differential model starts the tasks "
                   f"{', '.join(n for n, c in TASKS.items() if c.pretrained)})")
            _check(not self.name, "model.name", self.name,
                   "empty with model.pretrained (the checkpoint names the model)")
            attention = self.overrides.get("attention", {})
            _check(set(self.overrides) <= {"attention", "backend"} and isinstance(attention, dict)
                   and set(attention) <= {"backend"}, "model.overrides", self.overrides,
                   "only {attention: {backend: ...}} with model.pretrained (the checkpoint fixes its sizes and "
                   "λ_init; --set model.overrides.attention.backend=sdpa)")
        elif start:
            _check(task.model_name, f"model.{next(iter(start))}", next(iter(start.values())),
                   f"unset for task {task.name!r}, which builds its own model")
        _check(self.dtype in DTYPES, "model.dtype", self.dtype, f"one of {DTYPES}")
        for key in ("lora", "freeze_lambda"):
            _check(isinstance(getattr(self, key), bool), f"model.{key}", getattr(self, key), "true or false")
        _check(_is_int(self.lora_r) and self.lora_r >= 1, "model.lora_r", self.lora_r, "an integer >= 1")
        _check(isinstance(self.lora_alpha, (int, float)) and self.lora_alpha > 0, "model.lora_alpha",
               self.lora_alpha, "> 0")
        _check(isinstance(self.lora_targets, list) and bool(self.lora_targets)
               and all(isinstance(t, str) for t in self.lora_targets),
               "model.lora_targets", self.lora_targets, "a non-empty list of layer names")


@dataclass
class DataConfig:
    """``name``: ``digits`` (scikit-learn, always offline), ``tokens`` (a nanoGPT-style memmap at ``path``),
    ``text`` (a UTF-8 file at ``path``, byte-level tokens), ``sklearn_text`` (byte-level tokens of the dataset
    descriptions scikit-learn ships) or a name of ``diffattn.data.get_dataset`` (``path`` is then its root;
    text sets are tokenised with ``tokenizer``: ``gpt2``, ``clip`` or ``bytes``, UTF-8 bytes as ids < 256).
    ``block_size``: LM window length, or the token length of a text-classification sample."""

    name: str = "digits"
    path: str | None = None
    split: str = "train"
    block_size: int = 64
    dtype: str = "uint16"
    tokenizer: str = "gpt2"
    num_workers: int = 0
    img_size: int | None = None

    def check(self, task: type[Task]) -> None:
        """``block_size`` an integer >= 2; ``name`` one of the sets and formats ``task`` trains on (where it says)."""
        _check(_is_int(self.block_size) and self.block_size >= 2, "data.block_size", self.block_size,
               "an integer >= 2")
        names = task.data_names()
        if names is not None:
            _check(self.name in names, "data.name", self.name, f"one of {names} (for task {task.name!r})",
                   did_you_mean(self.name, names))


@dataclass
class OptimConfig:
    """AdamW (Loshchilov & Hutter 2019) with linear warm-up then cosine decay to ``min_lr_ratio · lr``."""

    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0

    def check(self) -> None:
        """The section's values: a positive ``lr``, the ranges of the others, two ``betas``."""
        _check(isinstance(self.lr, (int, float)) and self.lr > 0, "optim.lr", self.lr, "a number > 0")
        _check(isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0, "optim.weight_decay",
               self.weight_decay, "a number >= 0")
        _check(_is_int(self.warmup_steps) and self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps,
               "an integer >= 0")
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", self.min_lr_ratio, "in [0, 1]")
        _check(self.grad_clip is None or self.grad_clip > 0, "optim.grad_clip", self.grad_clip, "None or > 0")
        _check(isinstance(self.betas, (list, tuple)) and len(self.betas) == 2, "optim.betas", self.betas,
               "two numbers")


#: ``run.compile`` modes besides true/false: torch.compile's ``mode`` ("reduce-overhead" replays the compiled step as
#: CUDA graphs on a GPU, which removes the per-op launch cost of small models)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class RunConfig:
    """``batch_size`` is the GLOBAL batch per optimizer step: split over ``world_size`` ranks and ``accum_steps``
    micro-batches. Give ``steps`` (optimizer steps) or ``epochs``. ``device``: ``cpu``, ``cuda`` or ``cuda:N``
    (null: ``cuda`` when torch sees a GPU, else ``cpu``; under torchrun ``cuda`` is each process's
    ``cuda:LOCAL_RANK``); the GPUs torch sees are those of ``CUDA_VISIBLE_DEVICES``."""

    steps: int | None = None
    epochs: float | None = None
    batch_size: int = 32
    accum_steps: int = 1
    seed: int = 0
    device: str | None = None
    precision: str = "auto"
    compile: bool | str = False
    ema_decay: float | None = None
    distributed: str = "ddp"
    log_every: int = 10
    ckpt_every: int = 100
    keep_last: int = 3
    out: str = "runs/train"
    progress: bool = True
    threads: int | None = None

    def check(self) -> None:
        """The section's values: the batch and the step budget (exactly one of ``steps`` and ``epochs``), the
        device, precision, strategy, EMA and compile mode, and the logging and checkpoint intervals."""
        _check(_is_int(self.batch_size) and self.batch_size >= 1, "run.batch_size", self.batch_size,
               "an integer >= 1")
        _check(_is_int(self.accum_steps) and self.accum_steps >= 1, "run.accum_steps", self.accum_steps,
               "an integer >= 1")
        _check((self.steps is None) != (self.epochs is None), "run.steps/run.epochs", (self.steps, self.epochs),
               "exactly one of them set")
        _check(self.steps is None or (_is_int(self.steps) and self.steps >= 1), "run.steps", self.steps,
               "an integer >= 1")
        _check(self.epochs is None or (isinstance(self.epochs, (int, float)) and self.epochs > 0), "run.epochs",
               self.epochs, "> 0")
        check_device(self.device, "run.device")
        _check(self.precision in PRECISIONS, "run.precision", self.precision, f"one of {PRECISIONS}")
        _check(self.distributed in STRATEGIES, "run.distributed", self.distributed, f"one of {STRATEGIES}")
        _check(self.ema_decay is None or 0 < self.ema_decay < 1, "run.ema_decay", self.ema_decay,
               "None or in (0, 1)")
        _check(isinstance(self.compile, bool) or self.compile in COMPILE_MODES, "run.compile", self.compile,
               f"true, false or a torch.compile mode {COMPILE_MODES} (reduce-overhead captures CUDA graphs)")
        for key in ("log_every", "ckpt_every", "keep_last"):
            v = getattr(self, key)
            _check(_is_int(v) and v >= 1, f"run.{key}", v, "an integer >= 1")


@dataclass
class EvalConfig:
    """Validation while training: every ``every`` optimizer steps (and at the last) the task's quick evaluation runs
    on the held-out ``split`` (``path``: another file, for data without splits), on at most ``max_samples``
    samples; ``metric`` (default: the task's first of :data:`VAL_METRICS`) picks the checkpoint kept in ``best/``."""

    every: int | None = None
    metric: str | None = None
    split: str = "test"
    path: str | None = None
    max_samples: int = 512
    batch_size: int = 64

    def check(self, task: type[Task]) -> None:
        """The section's values, and with ``every`` set: that ``task`` validates while it trains and ``metric``
        is one of its metrics."""
        _check(self.every is None or (_is_int(self.every) and self.every >= 1), "eval.every", self.every,
               "null or an integer >= 1")
        _check(_is_int(self.max_samples) and self.max_samples >= 1, "eval.max_samples", self.max_samples,
               "an integer >= 1")
        _check(_is_int(self.batch_size) and self.batch_size >= 1, "eval.batch_size", self.batch_size,
               "an integer >= 1")
        if self.every is not None:
            _check(bool(task.metrics), "eval.every", self.every, f"null for task {task.name!r} (validation while "
                   f"training is there for {', '.join(n for n, c in TASKS.items() if c.metrics)})")
            _check(self.metric is None or self.metric in task.metrics, "eval.metric", self.metric,
                   f"one of {task.metrics} for task {task.name!r}")


@dataclass
class TrainConfig:
    task: TaskConfig = field(default_factory=lambda: _task_class("classify").Config())
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check(self) -> TrainConfig:
        """Check every section's values (types, ranges, choices), each by its own ``check`` against the task
        ``task.name`` (whose :meth:`~diffattn.train.tasks.Task.check_config` checks the ``task`` section); every
        error is a :class:`~diffattn.errors.UsageError` naming the key, the value and what is allowed. Returns
        ``self``."""
        task = _task_class(self.task.name)
        self.model.check(task)
        self.run.check()
        self.optim.check()
        task.check_config(self)
        self.data.check(task)
        self.eval.check(task)
        return self


_SECTIONS = {f.name: f.type for f in fields(TrainConfig)}
_SECTION_CLASSES = {"task": TaskConfig, "model": ModelConfig, "data": DataConfig, "optim": OptimConfig,
                    "run": RunConfig, "eval": EvalConfig}


def _task_class(name: str):
    """The registered task ``name`` (:data:`diffattn.train.tasks.TASKS`), or a UsageError naming the tasks."""
    check(isinstance(name, str) and name in TASKS, "task.name", name, f"one of {tuple(sorted(TASKS))}",
          did_you_mean(name, list(TASKS)) if isinstance(name, str) else "")
    return TASKS[name]


def _section(name: str, values: Any) -> Any:
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise UsageError(f"config section {name!r} must be a mapping, got {type(values).__name__}")
    cls, where = _SECTION_CLASSES[name], repr(name)
    if name == "task":  # the task's own options: the Config its registration declares
        task = _task_class(values.get("name", TaskConfig.name))
        cls, where = task.Config, f"'task' for task {task.name!r}"
    valid = [f.name for f in fields(cls)]
    unknown = [key for key in values if key not in valid]
    if unknown:
        keys = ", ".join(f"{name}.{k}{did_you_mean(k, valid)}" for k in unknown)
        raise UsageError(f"unknown config key{'s' if len(unknown) > 1 else ''} {keys} (valid keys in {where}: "
                         f"{', '.join(valid)})")
    types = {f.name: str(f.type) for f in fields(cls)}
    values = {k: _number(v) if "float" in types[k] else v for k, v in values.items()}
    return cls(**values)


_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _number(v: Any) -> Any:
    """YAML 1.1 reads ``3e-4`` (no dot) as a string: turn such strings into floats for float-typed keys."""
    return float(v) if isinstance(v, str) and _FLOAT.match(v.strip()) else v


_check, _is_int = check, is_int


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check values (types, ranges, choices); every error names the key, the value and what is allowed
    (:meth:`TrainConfig.check`, one ``check`` per section)."""
    return cfg.check()


def budget_warnings(cfg: TrainConfig) -> list[str]:
    """One line per setting of a valid config that undoes another: a warm-up (``optim.warmup_steps``) at least as
    long as the run (``run.steps``), where the lr rises linearly for the whole run and never reaches ``optim.lr``
    nor decays. ``diffattn train`` prints them as ``diffattn: warning: …`` before it starts (a run by epochs is
    checked by the loop, which knows the steps per epoch)."""
    steps, warmup = cfg.run.steps, cfg.optim.warmup_steps
    if steps is not None and warmup >= steps:
        return [f"optim.warmup_steps {warmup} is not shorter than run.steps {steps}: the learning rate rises for the "
                f"whole run and reaches only {steps / warmup:.0%} of optim.lr {cfg.optim.lr:g}; set "
                f"optim.warmup_steps below {steps} (e.g. --set optim.warmup_steps={max(1, steps // 10)})"]
    return []


def train_data_names(task: str) -> list[str]:
    """The ``data.name`` values task ``task`` trains on: its kinds of built-in sets and the formats it reads."""
    return _task_class(task).data_names() or []


def config_from_dict(d: dict[str, Any]) -> TrainConfig:
    """A :class:`TrainConfig` from a nested mapping; unknown sections or keys raise ``ValueError``."""
    if not isinstance(d, dict):
        raise UsageError(f"a config must be a mapping of sections {list(_SECTIONS)}, got {type(d).__name__}")
    for key in d:
        if key not in _SECTIONS:
            raise UsageError(f"unknown config section {key!r}; valid sections: {', '.join(_SECTIONS)}")
    return validate(TrainConfig(**{name: _section(name, d.get(name)) for name in _SECTIONS}))


def apply_overrides(d: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Apply ``section.key=value`` (or ``section.key.sub=value`` inside a mapping) to the nested dict ``d``;
    values are parsed as YAML (``3e-4``, ``true``, ``[1, 2]``). The 0.1.0 name of :func:`diffattn.configs.apply_sets`
    (on a copy of ``d``), deprecated: it warns (:data:`diffattn.deprecations.DEPRECATIONS`)."""
    warn_deprecated("diffattn.train.config.apply_overrides")
    return apply_sets(json.loads(json.dumps(d)), overrides, min_depth=2, example="section.key")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML recipe (or start from the defaults when ``path`` is None) and apply ``--set`` overrides.

    ``path`` is a YAML file or the name of a recipe shipped with the package (``"tiny/clip"``, also spelled
    ``"configs/tiny/clip.yaml"``; :func:`diffattn.configs.find_config`), so the recipes load from any folder."""
    import yaml

    d: dict[str, Any] = {}
    if path is not None:
        try:
            path = find_config(path)
        except FileNotFoundError:
            raise UsageError(f"config file {str(path)!r} does not exist and is not a packaged recipe "
                             f"({', '.join(config_names())})") from None
        try:
            d = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise yaml_error(path, e) from None
        except UnicodeDecodeError as e:
            raise UsageError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
        if not isinstance(d, dict):
            raise UsageError(f"{path} must hold a mapping of sections {list(_SECTIONS)}, got {type(d).__name__}")
    return config_from_dict(apply_sets(json.loads(json.dumps(d)), overrides, min_depth=2, example="section.key"))


def val_metric(cfg: TrainConfig) -> tuple[str, bool]:
    """(the metric that picks ``best/``, whether lower is better)."""
    metric = cfg.eval.metric or _task_class(cfg.task.name).metrics[0]
    return metric, higher_is_better(metric) is False


#: keys that may differ between a run and its resumption (they do not change the computation)
RESUMABLE_KEYS = {("run", "out"), ("run", "progress"), ("run", "log_every"), ("run", "ckpt_every"),
                  ("run", "keep_last"), ("data", "num_workers"), ("run", "threads"), ("run", "device")}
#: the step budget: it may change on resume, which extends (or shortens) the run; the lr schedule is then the one of
#: a run planned for the new total from the resume step on (:func:`diffattn.train.loop.train`)
BUDGET_KEYS = {("run", "steps"), ("run", "epochs")}


def digest_hash(d: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config a run records in ``config.yaml``: every section (the ``task`` section is the task's own
    ``Config``, so it holds only the keys the task reads). Loading it back gives ``cfg`` again."""
    return cfg.to_dict()


def config_digest(cfg: TrainConfig | dict) -> dict[str, Any]:
    """The part of the config a checkpoint must match to be resumed: everything but the logging/output keys
    (:data:`RESUMABLE_KEYS`), and of ``task`` only the keys its task reads. ``cfg`` may be a digest already (a
    checkpoint's), which is then reduced the same way."""
    d = json.loads(json.dumps(cfg if isinstance(cfg, dict) else asdict(cfg), default=str))
    d.setdefault("eval", asdict(EvalConfig()))  # checkpoints of runs made before the section existed
    for section, key in RESUMABLE_KEYS:
        d.get(section, {}).pop(key, None)
    task = d.get("task", {})
    keep = task_keys(task.get("name"))
    if keep is not None:
        d["task"] = {k: v for k, v in task.items() if k in keep}
    return d


def __getattr__(name: str):
    if name == "VAL_METRICS":  # each task's validation metrics, as its class declares them
        return {n: c.metrics for n, c in TASKS.items() if c.metrics}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
