"""What each value of a run config may be: number ranges, and the rules for text.

``schema`` builds a config's dataclasses from YAML and asks this module about every value:
a number outside its range, or text that could not be used safely, fails with a ConfigError
naming the key as a dotted path, so no later step (a plan, a Megatron flag, a line of an
sbatch script) ever sees it.
"""
from __future__ import annotations

import dataclasses
import math
import re


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending key."""


@dataclasses.dataclass(frozen=True)
class Bound:
    """The range a number in the config may take: from ``low`` up to ``high``.

    ``low_open``/``high_open`` exclude the end itself, so (0, inf) is "greater than 0".
    """

    low: float
    low_open: bool = False
    high: float = math.inf
    high_open: bool = True

    def admits(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self) -> str:
        if self.high == math.inf:
            return f"{'greater than' if self.low_open else 'at least'} {_number(self.low)}"
        return (f"in {'(' if self.low_open else '['}{_number(self.low)}, {_number(self.high)}"
                f"{')' if self.high_open else ']'}")


def _number(value: float) -> str:
    """A bound as a person reads it: 2^32 rather than 4.29497e+09."""
    if value == int(value) and value >= 2**16 and int(value) & (int(value) - 1) == 0:
        return f"2^{int(value).bit_length() - 1}"
    return f"{value:g}"


COUNT = Bound(1)  # sizes, counts, parallel degrees, intervals
NON_NEGATIVE = Bound(0)  # where 0 means "none" or "off": min_lr, warmup, clip_grad, eval_iters
POSITIVE = Bound(0, low_open=True)  # scales that 0 would break: lr, epsilon, init std
MOMENT_DECAY = Bound(0, high=1)  # Adam's betas: 1 would never forget, above 1 diverges

# Every int and float field of the schema has a range here (a test checks that none is
# missing): a value outside it fails at load time, naming the key.
BOUNDS: dict[str, Bound] = {
    **{f"model.{name}": COUNT for name in (
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
        "num_query_groups", "vocab_size", "seq_length", "max_position_embeddings",
        "rotary_base", "make_vocab_size_divisible_by", "q_lora_rank", "kv_lora_rank",
        "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")},
    # 1 would make every layer full attention: no window at all (remove model.window_size).
    "model.window_attn_skip_freq": Bound(2),
    "model.norm_epsilon": POSITIVE,
    "model.init_method_std": POSITIVE,
    **{f"parallel.{name}": COUNT for name in ("tensor", "context", "pipeline", "data")},
    "burst.intra_node_size": COUNT,
    "burst.ulysses_size": COUNT,
    "data.document_capacity": COUNT,
    "cluster.nodes": COUNT,
    "cluster.gpus_per_node": COUNT,
    "cluster.checkpoint_write_gbps": POSITIVE,
    "slurm.cpus_per_task": COUNT,
    "slurm.keep_checkpoints": COUNT,
    "slurm.keep_every": COUNT,
    **{f"training.{name}": COUNT for name in (
        "micro_batch_size", "global_batch_size", "train_iters", "recompute_num_layers",
        "log_interval", "save_interval", "eval_interval")},
    **{f"training.{name}": NON_NEGATIVE for name in (
        "min_lr", "lr_warmup_iters", "weight_decay", "clip_grad", "eval_iters")},
    # numpy, which Megatron seeds too (np.random.seed), takes seeds in [0, 2**32); Megatron
    # seeds nothing at all for 0 (`if seed_ > 0`), so a run with 0 would not repeat.
    # (``config.check_seed`` also keeps the pipeline stages' seeds in range.)
    "training.seed": Bound(1, high=2**32),
    "training.lr": POSITIVE,
    "training.adam_beta1": MOMENT_DECAY,
    "training.adam_beta2": MOMENT_DECAY,
}

# Every integer of a config becomes a Megatron argument that torch and numpy hold as int64.
INT_LIMIT = 2**63


def number_of(value: object, key: str, *, integer: bool) -> int | float:
    """``value`` as the config's int or float, or a ConfigError naming ``key``.

    bool is a subclass of int: True is refused where a number is meant. An integer too
    large for int64 (or, for a float key, too large for a float at all) is refused here,
    where the key is known, rather than overflowing in a later step.
    """
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ConfigError(f"'{key}' must be {'an integer' if integer else 'a number'}, "
                          f"got {value!r}")
    if integer:
        if abs(value) >= INT_LIMIT:
            raise ConfigError(f"'{key}' must be below 2^63 in size (a 64-bit integer, as "
                              f"Megatron holds it), got {_digits(value)}")
        return value
    try:
        number = float(value)
    except OverflowError:
        raise ConfigError(f"'{key}' must be a number a float can hold (below about 1.8e308), "
                          f"got {_digits(value)}") from None
    if not math.isfinite(number):
        raise ConfigError(f"'{key}' must be a finite number, got {number!r}")
    return number


def _digits(value: int) -> str:
    """A huge integer described by its length (YAML parsed it, so it is under Python's
    4,300-digit limit for str())."""
    return f"an integer of {len(str(abs(value)))} digits"


VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def control_character(text: str) -> tuple[int, str] | None:
    """The first control character of ``text`` (C0, DEL or C1) and its position, or None."""
    for position, char in enumerate(text):
        if ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0:
            return position, char
    return None


def check_text(value: str, key: str) -> str:
    """Refuse text that a later step could not use safely, naming ``key``.

    Names and paths end up in plans, Megatron flags and sbatch scripts: a newline there
    would start a new shell command or end an #SBATCH block, so no control character
    (newline, tab, escape, ...) is admitted anywhere; and '$' only as a ${NAME} variable,
    so nothing but those variables is ever expanded by a shell.
    """
    found = control_character(value)
    if found is not None:
        raise ConfigError(f"'{key}' holds a control character ({found[1]!r} at position "
                          f"{found[0]}); names, paths and flags are one line of text")
    if "$" in VARIABLE.sub("", value):
        raise ConfigError(f"'{key}': a '$' outside a ${{NAME}} variable in {value!r}")
    return value


# Megatron reads data.split as up to three weights (train, validation, test), normalised to
# their sum; it finds numbers with a regular expression and would take "abc" for no weights
# at all, then fail at start-up dividing by zero. Held here to the format it documents.
SPLIT_WEIGHT = r"\s*(\d+(\.\d*)?|\.\d+)\s*"
SPLIT = re.compile(rf"{SPLIT_WEIGHT}([,/]{SPLIT_WEIGHT}){{0,2}}")


def check_split(value: str, key: str) -> None:
    """'data.split': 1 to 3 non-negative weights separated by ',' or '/', training's above 0."""
    if not SPLIT.fullmatch(value):
        raise ConfigError(f"'{key}' must be 1 to 3 non-negative weights for train, validation "
                          f"and test, separated by ',' or '/' (e.g. \"969,30,1\"); got {value!r}")
    if float(re.split(r"[,/]", value)[0]) <= 0:
        raise ConfigError(f"'{key}' gives training no share ({value!r}): its first weight "
                          f"must be above 0")


def check_time_limit(value: str, key: str) -> None:
    """'slurm.time_limit': a limit sbatch --time takes (``slurm_time``)."""
    from .slurm_time import parse_time_limit

    try:
        parse_time_limit(value, f"'{key}'")
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_run_name(value: str, key: str) -> None:
    """'slurm.run_name': one folder name, in the characters an #SBATCH value may hold."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", value):
        raise ConfigError(f"'{key}' {value!r}: the run's folder name may hold only letters, "
                          f"digits and . _ + - (and starts with a letter or digit)")


# Checks of particular text keys, beyond the rules every text follows (check_text).
TEXT_RULES = {"data.split": check_split, "slurm.time_limit": check_time_limit,
              "slurm.max_time": check_time_limit, "slurm.run_name": check_run_name}
