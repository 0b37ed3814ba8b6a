"""Megatron's command-line options by meaning: the argparse destination of every spelling,
and which destinations Megatron sets again after parsing, from which (``megatron_rewrites``).

`owned_flags` checks a config's ``megatron_args`` with this, so ``--persistent-save-interval``
(an alias of ``--save-interval``) and ``--recompute-activations`` (which makes
``validate_args`` set ``recompute_granularity``) are caught like the flags they stand for.
Two tables of one shape:

- ``pinned_table()``: ``megatron_options.json``, generated from the megatron-core this project
  pins (PINNED, the wheel CI unpacks) and committed; reading it needs nothing installed, so
  `plan` and `flags` stay instant. Regenerate it with
  ``python -m megatron_burst.launch.config.megatron_options --megatron UNPACKED_WHEEL --write``; a
  test regenerates it and compares where that wheel is at hand.
- ``live_table()``: the same, from the ``megatron.training`` installed here (its own parser,
  its own source), for `run` on a GPU host, which imports it anyway.

The --burst-* options are not in the tables: every one of them is a config key (owned_flags).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path

from .megatron_rewrites import ANY, rewrite_sources

PINNED = "0.19.2"
TABLE_FILE = Path(__file__).with_name("megatron_options.json")
COMMAND = "python -m megatron_burst.launch.config.megatron_options --megatron PATH --write"


@dataclasses.dataclass(frozen=True)
class OptionTable:
    """Megatron's options: ``dests`` option -> destination; ``set_after_parsing``
    destination -> the destinations its value can come from after parsing (ANY: any)."""

    megatron_core: str
    dests: dict[str, str]
    set_after_parsing: dict[str, list[str]]
    _forward: dict[str, list[str]] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        forward: dict[str, list[str]] = {}
        for target, sources in self.set_after_parsing.items():
            for source in sources:
                forward.setdefault(source, []).append(target)
        object.__setattr__(self, "_forward", forward)

    def dest(self, option: str) -> str | None:
        return self.dests.get(option)

    def spellings(self, dest: str) -> list[str]:
        return sorted(option for option, d in self.dests.items() if d == dest)

    def reaches(self, dest: str) -> list[str]:
        """The destinations Megatron may set from ``dest`` after parsing, nearest first
        (ANY where it may set any)."""
        seen, order, queue = {dest}, [], [dest]
        while queue:
            for target in self._forward.get(queue.pop(0), ()):
                if target not in seen:
                    seen.add(target)
                    order.append(target)
                    queue.append(target)
        return order

    def to_json(self) -> dict:
        return {"megatron_core": self.megatron_core, "generated_by": COMMAND,
                "dests": self.dests, "set_after_parsing": self.set_after_parsing}


@functools.lru_cache(maxsize=1)
def pinned_table() -> OptionTable:
    """The committed table of the pinned megatron-core (see the module docstring)."""
    raw = json.loads(TABLE_FILE.read_text())
    return OptionTable(raw["megatron_core"], raw["dests"], raw["set_after_parsing"])


def live_table() -> OptionTable:
    """The table of the megatron.training importable here (imports it, and torch)."""
    return generate(None)


def generate(root: Path | None) -> OptionTable:
    """The table of the megatron.training under ``root`` (a folder holding ``megatron/``,
    first on sys.path already) or, with None, of the importable one."""
    import typing

    if not hasattr(typing, "override"):  # megatron 0.17+ names it; Python 3.11 lacks it
        import typing_extensions

        typing.override = typing_extensions.override
    import megatron.training.arguments as arguments
    from megatron.core.package_info import __version__

    # package_info appends the short hash of whatever git checkout holds the wheel (CI
    # unpacks it inside this repo): that local tag names our commit, not Megatron's release.
    release = __version__.split("+")[0]

    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    dests = {option: action.dest for action in parser._actions
             for option in action.option_strings if option.startswith("--")}
    dests.pop("--help", None)
    return OptionTable(release, dict(sorted(dests.items())), rewrite_sources(root))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND.split(" --")[0],
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--megatron", metavar="PATH",
                        help="a folder holding megatron/ (an unpacked megatron-core wheel); "
                             "default: the installed one")
    parser.add_argument("--write", action="store_true",
                        help=f"write {TABLE_FILE.name} instead of printing the table")
    args = parser.parse_args(argv)
    if args.megatron:
        sys.path.insert(0, args.megatron)  # before anything imports megatron
    table = generate(Path(args.megatron) if args.megatron else None)
    text = json.dumps(table.to_json(), indent=1, sort_keys=True) + "\n"
    if args.write:
        TABLE_FILE.write_text(text)
        print(f"wrote {TABLE_FILE} (megatron-core {table.megatron_core})")
    else:
        sys.stdout.write(text)
    return 0


__all__ = ["ANY", "OptionTable", "PINNED", "generate", "live_table", "pinned_table"]

if __name__ == "__main__":
    raise SystemExit(main())
