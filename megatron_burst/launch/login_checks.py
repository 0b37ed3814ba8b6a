"""What a machine without GPUs (a cluster's login node) can check of a GPU run before it
queues: everything but the GPUs.

`run CONFIG --dry-run` on such a machine makes these checks and names every problem it
finds, each in one line saying what to change:

- the config, its plan and the memory fit (``plan.validate``), and the job plan (time
  limit, saves) the sbatch script would carry;
- ``megatron_args`` against Megatron's own parser where ``megatron.training`` imports here
  (the whole command line is parsed, the adapter's --burst-* options included), else
  against the pinned option table, which the loader used already;
- the modules the run imports, found by name (``importlib.util.find_spec``: nothing heavy
  is imported; a module that is found may still fail on the GPU host);
- the data: every dataset prefix of the data path has its .bin and .idx, and the
  tokenizer model exists, with ${VARIABLES} expanded from this shell as the job's will be;
- the sbatch script `slurm` writes for it, read by ``bash -n``.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Mapping

from .config.schema import Config, ConfigError, expand_vars
from .run.flags import data_path_words, megatron_flags
from .planning.job_plan import job_plan
from .planning.plan import validate
from .run.runtime_deps import run_needs


class LoginCheckError(ValueError):
    """A GPU run that would fail after the queue; the message names what to change."""


def missing_modules(cfg: Config) -> list[str]:
    """One line for each module the run imports that cannot be found here, by name."""
    missing = []
    for need in run_needs(cfg):
        try:
            with warnings.catch_warnings():  # megatron-core warns at import of what it lacks
                warnings.simplefilter("ignore")
                found = importlib.util.find_spec(need.module) is not None
        except (ImportError, ValueError):  # a parent package that is missing or broken
            found = False
        if not found:
            missing.append(need.missing())
    return missing


def check_data(cfg: Config, env: Mapping[str, str]) -> str:
    """The data the job reads exists (prefix.bin and .idx, the tokenizer model); what it
    found, in a few words. ConfigError naming the key or variable if not."""
    d = cfg.data
    if d.mock:
        return "synthetic data (data.mock)"
    text = expand_vars(d.data_path, "data.data_path", env)
    words = data_path_words(text, d.data_path)
    prefixes = words if len(words) == 1 else words[1::2]
    for prefix in prefixes:
        for suffix in (".bin", ".idx"):
            if not Path(prefix + suffix).is_file():
                raise ConfigError(f"'data.data_path' ({d.data_path!r}): {prefix}{suffix} is not "
                                  f"a file here; a dataset prefix names PREFIX.bin and "
                                  f"PREFIX.idx (`megatron-burst data` writes them)")
    found = f"{len(prefixes)} dataset(s)"
    if d.tokenizer_model:
        model = expand_vars(d.tokenizer_model, "data.tokenizer_model", env)
        if not Path(model).exists():
            raise ConfigError(f"'data.tokenizer_model' ({d.tokenizer_model!r}): {model} does "
                              f"not exist here")
        found += f", tokenizer {model}"
    return found


def parse_with_megatron(cfg: Config, env: Mapping[str, str]) -> str:
    """Parse the run's command line with Megatron's own parser, where it imports here; what
    was checked. LoginCheckError for an argument it refuses."""
    try:
        from megatron.training import arguments  # noqa: PLC0415 - only where installed
        from ..megatron.arguments import add_burst_args
    except Exception:  # noqa: BLE001 - any failure: the pinned table has checked the flags
        from .config.megatron_options import pinned_table

        return (f"flags checked against the pinned option table (megatron-core "
                f"{pinned_table().megatron_core}): megatron.training does not import here")
    parser = add_burst_args(arguments.add_megatron_arguments(
        argparse.ArgumentParser(allow_abbrev=False)))

    def refuse(message: str) -> None:
        raise LoginCheckError(f"Megatron's parser refuses the run's flags: {message}")

    parser.error = refuse  # type: ignore[method-assign]
    flags = megatron_flags(cfg, env=env, save="/ckpt", load="/ckpt")
    _, unknown = parser.parse_known_args(flags)
    if unknown:
        refuse(f"unrecognized arguments: {' '.join(unknown)}")
    return "flags parsed by the installed Megatron's parser"


def check_script(cfg: Config, config_path: str) -> str:
    """The sbatch script `slurm` writes for ``cfg`` is valid bash (``bash -n``)."""
    from .slurm.sbatch import sbatch_script

    text = sbatch_script(cfg, config_path)
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch") as script:
        script.write(text)
        script.flush()
        result = subprocess.run(["bash", "-n", script.name], capture_output=True, text=True)
    if result.returncode:
        raise LoginCheckError(f"the sbatch script for {config_path} is not valid bash: "
                              f"{result.stderr.strip()}")
    return f"the sbatch script ({len(text.splitlines())} lines) reads as bash"


def check_without_gpus(cfg: Config, config_path: str, env: Mapping[str, str] | None = None
                       ) -> tuple[list[str], list[str]]:
    """Every check of the module docstring: (what each found, the problems). The config and
    plan come first and stop at once (ConfigError): the rest are made from them; the others
    are each made, so that one missing module does not hide a missing dataset."""
    env = os.environ if env is None else env
    plan_warnings = validate(cfg)
    plan = job_plan(cfg)
    found = [f"config and plan: {config_path} fits ({len(plan_warnings)} warning(s)); one "
             f"allocation of {plan.limit}, {plan.allocations} expected"]
    problems: list[str] = []
    checks = [lambda: parse_with_megatron(cfg, env), lambda: _modules(cfg),
              lambda: f"data: {check_data(cfg, env)}", lambda: check_script(cfg, config_path)]
    for check in checks:
        try:
            found.append(check())
        except ValueError as e:
            problems.append(str(e))
    return found, problems


def _modules(cfg: Config) -> str:
    missing = missing_modules(cfg)
    if missing:
        raise LoginCheckError("; ".join(missing))
    return f"modules found: {', '.join(need.module for need in run_needs(cfg))}"
