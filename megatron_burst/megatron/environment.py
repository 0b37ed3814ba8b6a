"""What this Python environment can run: megatron-core for the CPU run and the dataset writer,
megatron.training for the GPU entry point.

`python -m megatron_burst.megatron.pretrain_gpt` is built on ``megatron.training``, which
ships in the megatron-core wheel only from 0.17 on, and those wheels declare Python >= 3.12;
on Python 3.11 pip resolves ``megatron-core`` to 0.16.1, which lacks it. Both `megatron-burst
run` (before it starts torchrun) and the entry point itself (when the import fails) say so in
one line, with the same words from here, instead of a bare ModuleNotFoundError from every rank.

Resuming with the distributed optimizer needs Megatron's fused Adam (TransformerEngine or
apex): ``distributed_optimizer_resume_problem`` says so before training, for the entry point,
and the sbatch scripts make the same check with the same words.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

TRAINING_NEEDS = ("megatron_burst.megatron.pretrain_gpt needs megatron.training, which ships "
                  "in megatron-core >= 0.17 (Python >= 3.12: pip install -e '.[megatron,train]') "
                  "or with a Megatron-LM checkout on PYTHONPATH (core_v0.18.0 and later, "
                  "core_v0.19.0 included, need Python >= 3.12; core_v0.17.x runs on 3.11)")
# Megatron-LM core_v0.18.0 and later import typing.override (new in Python 3.12) from
# megatron.training; on 3.11 that import fails with this in its message.
NEEDS_PYTHON_312 = "override"


def _importable(module: str) -> bool:
    """Whether ``module`` can be found, without importing it (a missing parent is False)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def _python() -> tuple[int, int]:
    """This interpreter's (major, minor) version."""
    return sys.version_info.major, sys.version_info.minor


def _tree_version(core_dir: Path) -> str | None:
    """The version a megatron/core folder declares (package_info.py), read without importing."""
    try:
        text = (core_dir / "package_info.py").read_text()
    except OSError:
        return None
    parts = [re.search(rf"^{name}\s*=\s*(\d+)", text, re.MULTILINE)
             for name in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else None


def installed_megatron_core() -> str:
    """Which megatron.core this interpreter imports, and the Python, for messages: the pip
    distribution ('megatron-core 0.16.1') or a checkout on PYTHONPATH ('Megatron-LM at PATH
    (core 0.19.0)'), since a checkout hides the installed wheel."""
    python = "Python {}.{}".format(*_python())
    try:
        spec = importlib.util.find_spec("megatron.core")
    except ImportError:
        spec = None
    if spec is None or not spec.origin:
        return f"no megatron-core on {python}"
    core_dir = Path(spec.origin).resolve().parent
    version = _tree_version(core_dir) or "of unknown version"
    try:
        dist = importlib.metadata.distribution("megatron-core")
        wheel_dir = Path(str(dist.locate_file("megatron/core"))).resolve()
    except importlib.metadata.PackageNotFoundError:
        wheel_dir = None
    if wheel_dir == core_dir:
        return f"megatron-core {dist.version} on {python}"
    return f"Megatron-LM at {core_dir.parent.parent} (core {version}) on {python}"


def missing_training_message(error: BaseException | None = None) -> str:
    """One line: what the entry point needs, what this environment has and why it failed."""
    why = ""
    if error is not None:
        why = f"; import failed: {error}"
        if NEEDS_PYTHON_312 in str(error) and _python() < (3, 12):
            why += (" (this Megatron needs Python >= 3.12: use Python 3.12, or a "
                    "core_v0.17.x checkout on Python 3.11)")
    return f"{TRAINING_NEEDS}; this environment has {installed_megatron_core()}{why}"


def training_entry_point_problem() -> str | None:
    """None if the Megatron entry point can import its training loop, else why not."""
    if not _importable("megatron.training"):
        return missing_training_message()
    try:  # found is not importable: a checkout that needs a newer Python fails here
        importlib.import_module("megatron.training")
    except Exception as error:  # noqa: BLE001 - whatever stops the import stops the run
        return missing_training_message(error)
    return None


def megatron_core_problem(purpose: str) -> str | None:
    """None if megatron-core is installed, else one line: ``purpose`` needs it, and how."""
    if _importable("megatron.core"):
        return None
    return f"{purpose} needs megatron-core, which is not installed: pip install -e '.[megatron]'"


# Megatron's optimizer is TransformerEngine's FusedAdam, else apex's, else torch's Adam; with
# torch's, megatron-core 0.19's distributed optimizer cannot load the state it saved
# (`assert len(steps) == 1`; `KeyError: 'step'` with --ckpt-format torch), so a requeued job
# that resumes with --use-distributed-optimizer fails after its first allocation.
FUSED_ADAM_IMPORTS = (("transformer_engine.pytorch.optimizers", "TransformerEngine"),
                      ("apex.optimizers", "apex"))
RESUME_WAY_OUT = ("install transformer-engine or apex, or train without the distributed "
                  "optimizer (config training.distributed_optimizer: false, i.e. no "
                  "--use-distributed-optimizer; the default --ckpt-format torch_dist then "
                  "resumes with torch.optim.Adam)")


def fused_adam_source() -> str | None:
    """Which library Megatron would take its fused Adam from ('TransformerEngine', 'apex'),
    or None (torch's Adam): the same imports, in the same order, as megatron.core.optimizer."""
    import importlib

    for module, library in FUSED_ADAM_IMPORTS:
        try:
            importlib.import_module(module).FusedAdam
        except (ImportError, AttributeError):
            continue
        return library
    return None


def distributed_optimizer_resume_problem(use_distributed_optimizer: bool,
                                         resumed: str | None) -> str | None:
    """None if a run can load the optimizer state it will load, else one line saying why
    not and the way out.

    ``resumed``: where the run's optimizer state comes from, None if it loads none (for the
    entry point, ``megatron.resume.optimizer_state_source(args)``, which decides it as
    Megatron's load_checkpoint does: release checkpoints, --finetune, --no-load-optim,
    --ckpt-step, non-persistent checkpoints). Loading distributed-optimizer state needs
    Megatron's fused Adam (TransformerEngine or apex).
    """
    if not use_distributed_optimizer or not resumed or fused_adam_source() is not None:
        return None
    return (f"resuming the optimizer state of {resumed} with --use-distributed-optimizer "
            f"needs TransformerEngine or apex (neither imports here; with torch.optim.Adam "
            f"megatron-core cannot load the distributed optimizer state); {RESUME_WAY_OUT}, "
            f"or start without it (--no-load-optim)")
