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

from ..configs import apply_sets, config_names, find_config
from ..directions import higher_is_better
from ..errors import UsageError, did_you_mean, yaml_error
from ..models import is_model, list_models
from ..utils import check_device
from .tasks import TASKS, task_keys
from .tasks.base import TaskConfig, check, is_int

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
    """Check values (types, ranges, choices); every error names the key, the value and what is allowed."""
    t, r, o = cfg.task, cfg.run, cfg.optim
    task = _task_class(t.name)
    m = cfg.model
    _check(not task.model_name or bool(m.name) or bool(m.pretrained), "model.name", m.name,
           "a registered model name (list them with `diffattn models`)" +
           (", or give model.pretrained" if task.pretrained else ""))
    _check(isinstance(m.overrides, dict), "model.overrides", m.overrides, "a mapping")
    _check_model_start(cfg, task)
    _check(_is_int(r.batch_size) and r.batch_size >= 1, "run.batch_size", r.batch_size, "an integer >= 1")
    _check(_is_int(r.accum_steps) and r.accum_steps >= 1, "run.accum_steps", r.accum_steps, "an integer >= 1")
    _check((r.steps is None) != (r.epochs is None), "run.steps/run.epochs", (r.steps, r.epochs),
           "exactly one of them set")
    _check(r.steps is None or (_is_int(r.steps) and r.steps >= 1), "run.steps", r.steps, "an integer >= 1")
    _check(r.epochs is None or (isinstance(r.epochs, (int, float)) and r.epochs > 0), "run.epochs", r.epochs, "> 0")
    check_device(r.device, "run.device")
    _check(r.precision in PRECISIONS, "run.precision", r.precision, f"one of {PRECISIONS}")
    _check(r.distributed in STRATEGIES, "run.distributed", r.distributed, f"one of {STRATEGIES}")
    _check(r.ema_decay is None or 0 < r.ema_decay < 1, "run.ema_decay", r.ema_decay, "None or in (0, 1)")
    _check(isinstance(r.compile, bool) or r.compile in COMPILE_MODES, "run.compile", r.compile,
           f"true, false or a torch.compile mode {COMPILE_MODES} (reduce-overhead captures CUDA graphs)")
    for key in ("log_every", "ckpt_every", "keep_last"):
        v = getattr(r, key)
        _check(_is_int(v) and v >= 1, f"run.{key}", v, "an integer >= 1")
    _check(isinstance(o.lr, (int, float)) and o.lr > 0, "optim.lr", o.lr, "a number > 0")
    _check(isinstance(o.weight_decay, (int, float)) and o.weight_decay >= 0, "optim.weight_decay", o.weight_decay,
           "a number >= 0")
    _check(_is_int(o.warmup_steps) and o.warmup_steps >= 0, "optim.warmup_steps", o.warmup_steps, "an integer >= 0")
    _check(0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio", o.min_lr_ratio, "in [0, 1]")
    _check(o.grad_clip is None or o.grad_clip > 0, "optim.grad_clip", o.grad_clip, "None or > 0")
    _check(isinstance(o.betas, (list, tuple)) and len(o.betas) == 2, "optim.betas", o.betas, "two numbers")
    task.check_config(cfg)
    _check(_is_int(cfg.data.block_size) and cfg.data.block_size >= 2, "data.block_size", cfg.data.block_size,
           "an integer >= 2")
    if cfg.model.name and task.model_name and not cfg.model.pretrained:
        _check(is_model(cfg.model.name), "model.name", cfg.model.name,
               "a registered model name (list them with `diffattn models`)",
               did_you_mean(cfg.model.name, list_models()))
    e = cfg.eval
    _check(e.every is None or (_is_int(e.every) and e.every >= 1), "eval.every", e.every, "null or an integer >= 1")
    _check(_is_int(e.max_samples) and e.max_samples >= 1, "eval.max_samples", e.max_samples, "an integer >= 1")
    _check(_is_int(e.batch_size) and e.batch_size >= 1, "eval.batch_size", e.batch_size, "an integer >= 1")
    if e.every is not None:
        _check(bool(task.metrics), "eval.every", e.every, f"null for task {t.name!r} (validation while training "
               f"is there for {', '.join(n for n, c in TASKS.items() if c.metrics)})")
        _check(e.metric is None or e.metric in task.metrics, "eval.metric", e.metric,
               f"one of {task.metrics} for task {t.name!r}")
    names = task.data_names()
    if names is not None:
        _check(cfg.data.name in names, "data.name", cfg.data.name, f"one of {names} (for task {t.name!r})",
               did_you_mean(cfg.data.name, names))
    return cfg


def _check_model_start(cfg: TrainConfig, task) -> None:
    """``model.pretrained``, ``dtype``, ``lora*`` and ``freeze_lambda``: where the task takes them, and their values.
    λ_init is not among them: a released checkpoint's λ_init is fixed by the layer index (DiffLlama's and Motif's
    schedules), another one changes the function it computes and cannot be written back in its layout."""
    m, default = cfg.model, ModelConfig()
    start = {k: getattr(m, k) for k in ("pretrained", "lora", "freeze_lambda") if getattr(m, k) != getattr(default, k)}
    if m.pretrained is not None:
        _check(isinstance(m.pretrained, str) and bool(m.pretrained), "model.pretrained", m.pretrained,
               "a folder or a Hugging Face Hub id (org/name)")
        _check(task.pretrained, "model.pretrained", m.pretrained,
               f"null for task {task.name!r} (a released differential model starts the tasks "
               f"{', '.join(n for n, c in TASKS.items() if c.pretrained)})")
        _check(not m.name, "model.name", m.name, "empty with model.pretrained (the checkpoint names the model)")
        attention = m.overrides.get("attention", {})
        _check(set(m.overrides) <= {"attention", "backend"} and isinstance(attention, dict)
               and set(attention) <= {"backend"}, "model.overrides", m.overrides,
               "only {attention: {backend: ...}} with model.pretrained (the checkpoint fixes its sizes and λ_init; "
               "--set model.overrides.attention.backend=sdpa)")
    elif start:
        _check(task.model_name, f"model.{next(iter(start))}", next(iter(start.values())),
               f"unset for task {task.name!r}, which builds its own model")
    _check(m.dtype in DTYPES, "model.dtype", m.dtype, f"one of {DTYPES}")
    for key in ("lora", "freeze_lambda"):
        _check(isinstance(getattr(m, key), bool), f"model.{key}", getattr(m, key), "true or false")
    _check(_is_int(m.lora_r) and m.lora_r >= 1, "model.lora_r", m.lora_r, "an integer >= 1")
    _check(isinstance(m.lora_alpha, (int, float)) and m.lora_alpha > 0, "model.lora_alpha", m.lora_alpha, "> 0")
    _check(isinstance(m.lora_targets, list) and bool(m.lora_targets) and all(isinstance(t, str)
                                                                             for t in m.lora_targets),
           "model.lora_targets", m.lora_targets, "a non-empty list of layer names")


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
    values are parsed as YAML (``3e-4``, ``true``, ``[1, 2]``). An alias of :func:`diffattn.configs.apply_sets` kept
    from 0.1.0; removed in 0.3.0."""
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
