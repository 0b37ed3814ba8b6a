"""The YAML schema of a training run: dataclasses, a strict loader, and ${VAR} expansion.

A config file has five sections (model, parallel, burst, cluster, training) and optional
data and slurm sections. Loading is strict: an unknown or misspelt key, a value of the wrong
type, a choice outside its list or a number outside its range (a count below 1, a negative
rate) fails with a ConfigError that names the key as a dotted path (``model.hidden_size``),
so a typo never silently falls back to a default and no later step sees a negative size.

Strings may hold ``${NAME}`` variables (data and tokenizer paths, output folders). They are
kept as written when loading, and expanded from the environment only where a real path is
needed (``flags``, ``run``); the sbatch scripts keep them for the shell to expand.

Arithmetic consistency (heads divide TP, CP divides the sequence, the world size adds up,
memory fits) is checked by ``plan.validate``, not here: this file knows shapes, not sums.
The model section and the rules between its attention keys are ``model``'s.
"""
from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

from ...decide.options import OPTION_FIELDS
from .file import read_config_yaml
from .hardware import HARDWARE, Hardware
from .values import (BOUNDS, TEXT_RULES, VARIABLE, ConfigError, check_text,
                     number_of)
from .model import SOFTMAX_TYPES, ModelConfig, check_model
from .owned_flags import check_megatron_args


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Sizes of the four parallel dimensions; their product is the world size."""

    tensor: int = 1
    context: int = 1
    pipeline: int = 1
    data: int = 1
    sequence_parallel: bool = True


# Where a config sets each field of the schema (megatron_burst.decide.options.BurstOptions), one
# key each: under `burst:`, but for the time model's profile, which is the cluster's, and
# the document options, which are the data's.
_OPTIONS_ELSEWHERE = {"profile": "cluster.profile", "document_mask": "data.document_mask",
                      "document_layout": "data.document_layout",
                      "document_capacity": "data.document_capacity"}
OPTION_KEYS = {f.name: _OPTIONS_ELSEWHERE.get(f.name, f"burst.{f.name}") for f in OPTION_FIELDS}
# The `burst:` section: the schema's other fields, with the schema's types, defaults and
# help: one spelling for each value (a flat ring is `intra_node_size: null`).
BURST_KEYS = tuple(name for name, key in OPTION_KEYS.items() if key.startswith("burst."))
BurstConfig = dataclasses.make_dataclass(
    "BurstConfig", [(f.name, f.type, dataclasses.field(default=f.metadata["default"],
                                                        metadata=f.metadata))
                    for f in OPTION_FIELDS if f.name in BURST_KEYS], frozen=True)
BurstConfig.__doc__ = "BurstAttention options (megatron_burst.decide.options.BurstOptions' fields)."
BurstConfig.__module__ = __name__


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Where the run goes: nodes x GPUs of a named accelerator (see HARDWARE)."""

    nodes: int = 1
    gpus_per_node: int = 8
    gpu: str = "a100-80gb"
    # The time model's profile: a file `megatron-burst tune` wrote, or a shipped name; by
    # default the one named for the GPU (a100-ib, h200-nvlink).
    profile: str | None = None
    # GB/s at which the job writes a checkpoint (all ranks together, to the checkpoint
    # folder's file system): sizes the time a save takes, hence the save interval and the
    # margin before the time limit. Shared parallel file systems give ~1-20; measure yours.
    checkpoint_write_gbps: float = 2.0

    @property
    def hardware(self) -> Hardware:
        return HARDWARE[self.gpu]

    @property
    def profile_name(self) -> str:
        """The time model's profile for this cluster."""
        return self.profile or self.hardware.profile

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Batch, schedule, precision, recompute, and checkpoint/log cadence."""

    micro_batch_size: int
    global_batch_size: int
    train_iters: int
    lr: float = 3.0e-4
    min_lr: float = 3.0e-5
    lr_warmup_iters: int = 0
    lr_decay_style: str = "cosine"
    weight_decay: float = 0.1
    clip_grad: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    precision: str = "bf16"
    recompute: str = "none"
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    distributed_optimizer: bool = True
    seed: int = 1234
    log_interval: int = 1
    # None: derived from the predicted step time and the checkpoint's write time (job_plan).
    save_interval: int | None = None
    eval_interval: int = 1000
    eval_iters: int = 0


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Dataset and tokenizer. mock: synthetic tokens (no files needed). document_mask: each
    sample is a pack of documents ending at EOD tokens (--burst-document-mask), sharded
    over the CP group as document_layout says (--burst-document-layout; unset: whole_docs);
    document_capacity: with pack_zigzag, the most documents a sample holds (its boundaries
    padded to that count, so CUDA graphs replay every micro-batch).
    mask_builder: 'module:function' making each micro-batch's slice mask
    (--burst-mask-builder; README, Slice masks)."""

    mock: bool = False
    data_path: str | None = None
    split: str = "99,1,0"
    tokenizer_type: str = "HuggingFaceTokenizer"
    tokenizer_model: str | None = None
    document_mask: bool = False
    document_layout: str | None = None
    document_capacity: int | None = None
    mask_builder: str | None = None


@dataclasses.dataclass(frozen=True)
class SlurmConfig:
    """How `megatron-burst slurm` writes the batch job (docs/configs.md: which keys have a
    command-line option)."""

    # One allocation's SLURM --time, in any format sbatch takes; None: the shorter of
    # job_plan.DEFAULT_ALLOCATION_MIN, max_time and the whole job. Longer jobs requeue.
    time_limit: str | None = None
    # The partition's longest --time (its MaxTime); UNLIMITED admits a job without a limit.
    max_time: str = "2-00:00:00"
    # The run's folder is RUN_ROOT/<run_name> for every job of the run, so a resubmission
    # resumes its checkpoints; None: the job name (the config file's name).
    run_name: str | None = None
    # Checkpoints kept: the newest keep_checkpoints the run saved, and each at an iteration
    # that is a multiple of keep_every (None: no such); the run deletes its other ones.
    keep_checkpoints: int = 2
    keep_every: int | None = None
    # A file the script sources before anything else: module load, venv or conda activation.
    setup: str | None = None
    # Where job folders go (checkpoints, logs); None: ${RUN_ROOT}, else $SLURM_SUBMIT_DIR/runs.
    run_root: str | None = None
    # CPUs for each node's torchrun; None: every CPU of the node ($SLURM_CPUS_ON_NODE).
    cpus_per_task: int | None = None


@dataclasses.dataclass(frozen=True)
class Config:
    """One training run: the whole file."""

    model: ModelConfig
    parallel: ParallelConfig
    training: TrainingConfig
    cluster: ClusterConfig = ClusterConfig()
    burst: BurstConfig = BurstConfig()
    data: DataConfig = DataConfig(mock=True, tokenizer_type="NullTokenizer")
    slurm: SlurmConfig = SlurmConfig()
    # Extra Megatron flags appended verbatim (checked by Megatron's own parser in tests).
    megatron_args: list[str] = dataclasses.field(default_factory=list)


# Closed vocabularies: a value outside these fails at load time, naming the key.
CHOICES: dict[str, tuple[str, ...]] = {
    "model.normalization": ("RMSNorm", "LayerNorm"),
    "model.activation": ("swiglu", "gelu"),
    "model.position_embedding": ("rope",),
    "model.softmax_type": SOFTMAX_TYPES,
    **{OPTION_KEYS[f.name]: tuple(f.metadata["choices"]) for f in OPTION_FIELDS
       if f.metadata["choices"]},  # burst.backward, data.document_layout
    "cluster.gpu": tuple(HARDWARE),
    "training.precision": ("bf16", "fp32"),
    "training.recompute": ("none", "selective", "full"),
    "training.recompute_method": ("uniform", "block"),
    "training.lr_decay_style": ("cosine", "linear", "constant"),
    "data.tokenizer_type": ("HuggingFaceTokenizer", "Llama2Tokenizer", "NullTokenizer"),
}


def load_config(path: str | os.PathLike) -> Config:
    """Read and check a YAML config file (variables are left unexpanded)."""
    path = Path(path)
    raw = read_config_yaml(path)
    try:
        return config_from_dict(raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def config_from_dict(raw: Any) -> Config:
    """Build a Config from parsed YAML, failing on unknown keys, bad types and choices, and
    on megatron_args that would set again what the config's keys decide."""
    cfg = _build(Config, raw, "")
    check_model(cfg.model)
    check_seed(cfg)
    check_megatron_args(cfg.megatron_args)
    return cfg


# Megatron seeds pipeline stage r with seed + 100 r (initialize._set_random_seed), and numpy
# refuses a seed of 2^32 or more: the last stage's must stay below it too.
SEED_LIMIT, SEED_STEP_PER_STAGE = 2**32, 100


def check_seed(cfg: Config) -> None:
    """Refuse a training.seed that Megatron's last pipeline stage would push past numpy's
    range (the key's own range, [1, 2^32), is checked when it is read)."""
    highest = SEED_LIMIT - 1 - SEED_STEP_PER_STAGE * (cfg.parallel.pipeline - 1)
    if cfg.training.seed > highest:
        raise ConfigError(f"'training.seed' is {cfg.training.seed}, but Megatron seeds pipeline "
                          f"stage r with seed + 100 r and numpy takes seeds below 2^32: with "
                          f"{cfg.parallel.pipeline} stages it must be at most {highest}")


def _build(cls: type, raw: Any, where: str) -> Any:
    """Instantiate dataclass ``cls`` from mapping ``raw``; ``where`` is the dotted prefix."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'the file'}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        key = f"{where}{unknown[0]}"
        raise ConfigError(f"unknown key '{key}' (known keys under "
                          f"'{where.rstrip('.') or 'top level'}': {', '.join(fields)})")
    kwargs = {}
    for name, field in fields.items():
        key = f"{where}{name}"
        if name not in raw:
            required = (field.default is dataclasses.MISSING
                        and field.default_factory is dataclasses.MISSING)
            if required:
                raise ConfigError(f"missing required key '{key}'")
            continue
        kwargs[name] = _convert(hints[name], raw[name], key)
    return cls(**kwargs)


def _convert(hint: Any, value: Any, key: str) -> Any:
    """Check ``value`` against type ``hint`` (recursing into dataclasses)."""
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key + ".")
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) > 1:  # a count or "auto" (burst.ulysses_size)
            return value if value == "auto" else _convert(int, value, key)
        return _convert(inner[0], value, key)
    if typing.get_origin(hint) in (list, tuple):  # tuple[x, ...]: a list kept hashable
        if not isinstance(value, list):
            raise ConfigError(f"'{key}' must be a list, got {value!r}")
        items = [_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if typing.get_origin(hint) is list else tuple(items)
    if hint in (int, float):
        value = number_of(value, key, integer=hint is int)
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"'{key}' must be true or false, got {value!r}")
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"'{key}' must be a string, got {value!r}")
        check_text(value, key)
        if key in TEXT_RULES:
            TEXT_RULES[key](value, key)
    if key in CHOICES and value not in CHOICES[key]:
        raise ConfigError(f"'{key}' must be one of {', '.join(CHOICES[key])}; got {value!r}")
    if key in BOUNDS and not BOUNDS[key].admits(value):
        raise ConfigError(f"'{key}' must be {BOUNDS[key].describe()}, got {value!r}")
    return value


def expand_vars(text: str, key: str, env: typing.Mapping[str, str] | None = None) -> str:
    """Replace ${NAME} in ``text`` from ``env`` (default os.environ); name key and var if unset."""
    env = os.environ if env is None else env

    def sub(m: re.Match) -> str:
        if m.group(1) not in env:
            raise ConfigError(f"'{key}' uses ${{{m.group(1)}}}, which is not set in the "
                              f"environment")
        return env[m.group(1)]

    return VARIABLE.sub(sub, text)


def variables(cfg: Config) -> list[str]:
    """Names of the ${VAR} variables a config uses, in order of first use."""
    seen: list[str] = []
    for text in [cfg.data.data_path, cfg.data.tokenizer_model, cfg.slurm.setup,
                 cfg.slurm.run_root, *cfg.megatron_args]:
        for name in VARIABLE.findall(text or ""):
            if name not in seen:
                seen.append(name)
    return seen


def with_nodes(cfg: Config, nodes: int) -> Config:
    """The same run on ``nodes`` nodes: data parallelism absorbs the change.

    Fails naming 'cluster.nodes' when the new world size is not a multiple of the model
    parallel size (tensor x context x pipeline).
    """
    p = cfg.parallel
    model_parallel = p.tensor * p.context * p.pipeline
    world = nodes * cfg.cluster.gpus_per_node
    if nodes < 1 or world % model_parallel:
        raise ConfigError(f"'cluster.nodes' = {nodes} gives {world} GPUs, not a multiple of "
                          f"tensor x context x pipeline = {model_parallel}")
    return dataclasses.replace(
        cfg, cluster=dataclasses.replace(cfg.cluster, nodes=nodes),
        parallel=dataclasses.replace(p, data=world // model_parallel))


def resize_note(before: Config, after: Config) -> str | None:
    """What ``with_nodes`` changed, in one line (None if nothing): the data parallelism that
    absorbed the new node count, and the microbatches per step that follow from it."""
    if before.cluster.nodes == after.cluster.nodes:
        return None
    p, tr = after.parallel, after.training
    per_step = [tr.global_batch_size // (tr.micro_batch_size * c.parallel.data)
                for c in (before, after)]
    return (f"--nodes {after.cluster.nodes} instead of cluster.nodes {before.cluster.nodes}: "
            f"data parallelism {before.parallel.data} -> {p.data} ({after.cluster.world_size} "
            f"GPUs; TP={p.tensor} CP={p.context} PP={p.pipeline} unchanged); global batch "
            f"{tr.global_batch_size} unchanged: {per_step[0]} -> {per_step[1]} microbatch(es) "
            f"per step on each data-parallel rank")
