"""The lines an sbatch script runs before training: the environment, then every check a run
would otherwise fail in after the queue wait (or, worse, after its first allocation).

- ``setup_lines``: source the set-up file (``slurm.setup`` / ``--setup``: module load, a venv
  or conda activation), without ``set -u``, which breaks common conda and module scripts.
  A batch job starts with the submitting shell's environment (sbatch's default
  ``--export=ALL``), but where the job runs is another shell, and a file that sets up the
  cluster's environment says what the job needs wherever it is submitted from;
- ``import_lines``: import what the run will (``runtime_deps.run_needs``: Megatron's training
  loop, einops for hierarchical CP groups, the tokenizer's library), one line naming the first
  that fails;
- ``resume_lines``: a requeued job resumes its optimizer state, which the distributed
  optimizer can only do with Megatron's fused Adam;
- ``variable_lines``: the ${VARIABLES} the config leaves to the cluster are set, and a data
  path splits into a prefix or a blend of weight-prefix pairs.
"""
from __future__ import annotations

import json
import shlex

from ...megatron.environment import FUSED_ADAM_IMPORTS, RESUME_WAY_OUT
from ..config.schema import VARIABLE, Config, variables
from ..run.flags import double_quoted
from ..run.runtime_deps import run_needs


def _is_set(name: str, config_path: str) -> str:
    """A line that stops the job unless ${name} is set (names are [A-Za-z_][A-Za-z0-9_]*)."""
    message = shlex.quote(f"error: set {name} before sbatch (see {config_path})")
    return f'[[ -n "${{{name}:-}}" ]] || {{ echo {message} >&2; exit 2; }}'


def setup_lines(setup: str | None, config_path: str) -> list[str]:
    """Source ``setup`` (a path; a ${VARIABLE} in it is the cluster shell's) if given. It
    may export what the config's other ${VARIABLES} name, so only its own are checked first."""
    if setup is None:
        return []
    path = double_quoted(setup)
    message = double_quoted(f"error: the set-up file {setup} (slurm.setup / --setup) is not a "
                            f"readable file (a relative path starts from the folder sbatch "
                            f"was run in)")
    return [
        "",
        "# The job's environment: the submitting shell's (sbatch exports it), then this file's.",
        *(_is_set(name, config_path) for name in dict.fromkeys(VARIABLE.findall(setup))),
        f"SETUP_FILE={path}",
        f'[[ -f "$SETUP_FILE" && -r "$SETUP_FILE" ]] || {{ echo {message} >&2; exit 2; }}',
        "# Without set -u: conda's and many module files read variables that may be unset.",
        "set +u",
        "# shellcheck source=/dev/null",
        'source "$SETUP_FILE"',
        "set -u",
    ]


def _import_program(cfg: Config) -> str:
    """Python that imports each module the run needs, printing one line for the first
    failure and exiting 2 (the messages are JSON strings: no shell or Python quoting)."""
    items = [[need.module, need.missing()] for need in run_needs(cfg)]
    return "\n".join([
        "import importlib, json, sys",
        f"for module, message in json.loads({json.dumps(json.dumps(items))}):",
        "    try:",
        "        importlib.import_module(module)",
        "    except Exception as error:",
        "        print(f'error: {message}; here: {type(error).__name__}: {error} (Python "
        "{sys.version.split()[0]})', file=sys.stderr)",
        "        sys.exit(2)",
    ])


RETENTION_IMPORT = ("error: megatron_burst does not import here: the job runs its entry point "
                    "and checkpoint retention from it; pip install -e . in the megatron-burst "
                    "checkout, in the environment the set-up file activates")


def import_lines(cfg: Config) -> list[str]:
    """Import, before training, every module the run will (the same list as `run`), and the
    checkpoint retention the script runs beside it."""
    modules = ", ".join(need.module for need in run_needs(cfg))
    return [
        "",
        f"# What the run imports ({modules}), before training starts.",
        "python3 -c " + shlex.quote(_import_program(cfg)) + " || exit 2",
        "python3 -c 'import megatron_burst.launch.slurm.checkpoint_retention' 2>/dev/null || "
        f"{{ echo {shlex.quote(RETENTION_IMPORT)} >&2; exit 2; }}",
    ]


def resume_lines(cfg: Config, config_path: str) -> list[str]:
    """Lines that stop the job before training if a requeue could not resume it."""
    if not cfg.training.distributed_optimizer:
        return []
    imports = " || ".join(f"python3 -c {shlex.quote(f'from {module} import FusedAdam')} "
                          f"2>/dev/null" for module, _ in FUSED_ADAM_IMPORTS)
    message = (f"error: a requeued job resumes with --use-distributed-optimizer, which needs "
               f"TransformerEngine or apex (neither imports here; with torch.optim.Adam "
               f"megatron-core cannot load the distributed optimizer state): "
               f"{RESUME_WAY_OUT.replace('config ', f'{config_path}: ')}, then regenerate "
               f"this script")
    return [
        "",
        "# A requeue resumes the optimizer state: with the distributed optimizer that needs",
        "# Megatron's fused Adam (TransformerEngine or apex), checked before training starts.",
        f"{imports} || {{",
        f"    echo {shlex.quote(message)} >&2",
        "    exit 2",
        "}",
    ]


def variable_lines(cfg: Config, config_path: str) -> list[str]:
    """Check the ${VARIABLES} the config leaves to the cluster are set."""
    names = variables(cfg)
    if not names:
        return []
    return ["", "# Paths the config leaves to the cluster.",
            *(_is_set(name, config_path) for name in names)]


def data_path_lines(data_path: str) -> list[str]:
    """Split the data path into words (a blend "0.7 a 0.3 b" is four), each then taken
    literally, and refuse an empty one or a blend that is not weight-prefix pairs."""
    message = shlex.quote("error: data.data_path must be one dataset prefix or a blend of "
                          "weight-prefix pairs (\"0.7 a 0.3 b\")")
    return [
        f"read -r -a DATA_PATH_WORDS <<< {double_quoted(data_path)}",
        'if (( ${#DATA_PATH_WORDS[@]} == 0 || (${#DATA_PATH_WORDS[@]} > 1 && '
        '${#DATA_PATH_WORDS[@]} % 2 == 1) )); then',
        f"    echo {message}\" (got ${{#DATA_PATH_WORDS[@]}} words)\" >&2",
        "    exit 2",
        "fi",
        "",
    ]
