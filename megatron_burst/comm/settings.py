"""The package's settings from the environment: every ``MEGATRON_BURST_*`` the core reads, read
in this one module, once, into one validated value (``BurstSettings``).

``current()`` reads the environment at its first call in a process and hands back the same
frozen value after that: nothing on a call's path reads the environment or stats a file
again. Each setting is checked where the value is made, and a bad one raises ValueError
naming its variable (so the first call that needs any setting fails loudly, before any
message moves). ``reload()`` reads the environment again: for an entry point that sets a
variable before it starts (a benchmark's ``--cache``) and for tests (``tests/conftest.py``
makes ``monkeypatch.setenv`` take effect). A forked process reads its own at first use.

The settings, all optional (a process runs with none set):

- ``MEGATRON_BURST_AGREE``: when the ranks compare a call's arguments (``first``, the
  default; ``always``; ``off``), ``attention.agree``;
- ``MEGATRON_BURST_TIMEOUT_S``: the bound on one host-blocking wait on CPU (default 600 s),
  ``comm.waits``;
- ``MEGATRON_BURST_EMULATE``: the link emulator's virtual nodes (off unless set),
  ``comm.emulator`` and the cluster view;
- ``MEGATRON_BURST_PROFILE``: the time model's profile for 'auto' (a name or a JSON file);
- ``MEGATRON_BURST_PROFILE_CACHE``: where profiles measured at first use are cached
  (default ``$XDG_CACHE_HOME`` or ``~/.cache``, then ``megatron-burst/profiles``);
- ``MEGATRON_BURST_AUTO_MEASURE``: whether 'auto' measures this machine (``on``, ``off``);
- ``MEGATRON_BURST_PREFETCH``: the Megatron data path makes batches ahead (1) or on the step;
- ``MEGATRON_BURST_TRACE``: ``DIR[:FIRST:COUNT]``, micro-batches the Megatron path profiles;
- ``MEGATRON_BURST_REPLAY``: whether an eager call's ring passes are captured once and
  replayed as CUDA graphs (``off``, the default; ``auto``: where a rank's queries are
  small, ``REPLAY_MAX_ELEMENTS``; ``on``), ``attention.replay``;
- ``MEGATRON_BURST_HOST_CHANNEL``: how the ranks of an NCCL group trade the numbers their
  hosts read (``gloo``, the default: a gloo twin of the group, ``comm.host_channel``;
  ``group``: the group itself, each read waiting for the GPU's queue);

and what the launcher says: torchrun's ``LOCAL_WORLD_SIZE`` (ranks per node) and ``RANK``.
This module is torch-free (the planner reads it).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Mapping

from .emulated_nodes import ENV as EMULATE_ENV, VirtualNodes

AGREE_ENV = "MEGATRON_BURST_AGREE"
AGREE_MODES = ("first", "always", "off")
TIMEOUT_ENV = "MEGATRON_BURST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
MAX_TIMEOUT_S = 1e9  # about 31 years: beyond it a wait's timedelta cannot be made
PROFILE_ENV = "MEGATRON_BURST_PROFILE"
CACHE_ENV = "MEGATRON_BURST_PROFILE_CACHE"
MEASURE_ENV = "MEGATRON_BURST_AUTO_MEASURE"
MEASURE_VALUES = ("on", "off")
PREFETCH_ENV = "MEGATRON_BURST_PREFETCH"  # 1 (default): make batches ahead; 0: on the step
TRACE_ENV = "MEGATRON_BURST_TRACE"
REPLAY_ENV = "MEGATRON_BURST_REPLAY"
REPLAY_VALUES = ("auto", "on", "off")
HOST_CHANNEL_ENV = "MEGATRON_BURST_HOST_CHANNEL"
HOST_CHANNELS = ("gloo", "group")


@dataclasses.dataclass(frozen=True)
class BurstSettings:
    """Every setting the core reads, validated (the module docstring lists them)."""

    agree: str = "first"
    timeout_s: float = DEFAULT_TIMEOUT_S
    emulate: VirtualNodes | None = None
    emulate_text: str | None = None  # as written, for the lines that name it
    profile: str | None = None
    profile_cache: Path | None = None  # None: not read yet (``from_env`` always sets it)
    auto_measure: bool = True
    prefetch: bool = True
    trace: tuple[str, int, int] | None = None  # (folder, first micro-batch, count)
    replay: str = "off"
    host_channel: str = "gloo"
    local_world_size: int | None = None
    launcher_rank: int = 0

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> "BurstSettings":
        """The settings ``env`` (default ``os.environ``) holds; ValueError naming the first
        variable that holds a bad value."""
        env = os.environ if env is None else env
        emulate = env.get(EMULATE_ENV) or None
        local = (env.get("LOCAL_WORLD_SIZE") or "").strip()
        rank = (env.get("RANK") or "").strip()
        return BurstSettings(
            agree=_choice(env, AGREE_ENV, AGREE_MODES, "first"),
            timeout_s=parse_timeout(env.get(TIMEOUT_ENV)),
            emulate=VirtualNodes.parse(emulate) if emulate else None, emulate_text=emulate,
            profile=env.get(PROFILE_ENV) or None,
            profile_cache=_cache_dir(env),
            auto_measure=_choice(env, MEASURE_ENV, MEASURE_VALUES, "on") == "on",
            prefetch=_switch(env, PREFETCH_ENV),
            trace=parse_trace(env[TRACE_ENV]) if env.get(TRACE_ENV) else None,
            replay=_choice(env, REPLAY_ENV, REPLAY_VALUES, "off"),
            host_channel=_choice(env, HOST_CHANNEL_ENV, HOST_CHANNELS, "gloo"),
            local_world_size=int(local) if local.isdigit() and int(local) > 0 else None,
            launcher_rank=int(rank) if rank.isdigit() else 0)


_CURRENT: list[BurstSettings] = []  # the process's settings, once read


def current() -> BurstSettings:
    """This process's settings: read from the environment at the first call, then kept."""
    if not _CURRENT:
        _CURRENT.append(BurstSettings.from_env())
    return _CURRENT[0]


def reload() -> BurstSettings:
    """Read the environment again (an entry point that set a variable, a test)."""
    _CURRENT.clear()
    return current()


def forget() -> None:
    """Drop the settings read: the next ``current()`` reads the environment again."""
    _CURRENT.clear()


os.register_at_fork(after_in_child=forget)  # a forked rank reads its own environment


def _choice(env: Mapping[str, str], name: str, values: tuple[str, ...], default: str) -> str:
    value = (env.get(name) or default).strip().lower() or default
    if value not in values:
        raise ValueError(f"{name} must be one of {values}, got {env.get(name)!r}")
    return value


def _switch(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "1").strip().lower()
    if raw in ("1", "on", "true"):
        return True
    if raw in ("0", "off", "false"):
        return False
    raise ValueError(f"{name} must be 1 or 0, got {raw!r}")


def parse_timeout(raw: str | None) -> float:
    """Seconds of one bounded wait: a finite number in (0, 1e9]; ValueError naming the
    variable otherwise (nan and inf too)."""
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_TIMEOUT_S:  # also rejects nan and inf
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds above 0 and at most "
                         f"{MAX_TIMEOUT_S:g}, got {raw!r}")
    return value


def parse_trace(raw: str) -> tuple[str, int, int]:
    """(folder, first micro-batch, count) from ``DIR[:FIRST:COUNT]`` (default ``DIR:4:3``);
    ValueError naming the variable otherwise."""
    parts = raw.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        folder, first, count = parts[0], int(parts[1]), int(parts[2])
    else:
        folder, first, count = raw, 4, 3
    if not folder or count < 1:
        raise ValueError(f"{TRACE_ENV} must be DIR or DIR:FIRST:COUNT (COUNT >= 1), got {raw!r}")
    return folder, first, count


def _cache_dir(env: Mapping[str, str]) -> Path:
    """Where measured profiles are cached: ``$MEGATRON_BURST_PROFILE_CACHE``, a directory (or
    none yet), else the user's cache folder."""
    text = env.get(CACHE_ENV)
    if text is not None:
        if not text.strip():
            raise ValueError(f"{CACHE_ENV} is set but empty: name a directory, or unset it "
                             f"for the default (~/.cache/megatron-burst/profiles)")
        path = Path(text).expanduser()
        if path.exists() and not path.is_dir():
            raise ValueError(f"{CACHE_ENV}={text!r} is not a directory")
        return path
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "megatron-burst" / "profiles"
