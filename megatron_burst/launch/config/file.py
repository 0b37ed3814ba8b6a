"""Reading a config file: YAML in, plain data out, with every mistake a one-line ConfigError.

PyYAML keeps the last of two equal keys in a mapping without a word, so a config that says
``num_layers: 2`` and, further down, ``num_layers: 4`` would quietly train four layers.
Here the document is composed first and every mapping checked for repeated keys, which are
refused naming the dotted key and both lines; then it is built as ``yaml.safe_load`` would.
YAML 1.1 also reads an unquoted ``12:00:00`` as the base-60 number 43200: such a value is
refused, saying to quote it (no config key takes a base-60 number).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .values import ConfigError


def read_config_yaml(path: Path) -> Any:
    """The parsed YAML of the config at ``path`` (ConfigError naming the file if it cannot)."""
    text = _read_config_file(path)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:  # an empty file
            return None
        _refuse_duplicate_keys(node, "")
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: "
                          f"{getattr(e, 'problem', None) or e}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    finally:
        loader.dispose()


# Python refuses to turn longer digit strings into an int (sys.get_int_max_str_digits);
# PyYAML would raise that as a bare ValueError, naming no key.
MAX_INT_DIGITS = 4300
INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"


def _refuse_duplicate_keys(node: yaml.Node, where: str) -> None:
    """Raise naming the first key that appears twice in any mapping under ``node``, or
    that holds an integer too long for Python to read, or a base-60 number."""
    if (isinstance(node, yaml.ScalarNode) and node.tag in (INT_TAG, FLOAT_TAG)
            and ":" in str(node.value)):
        raise ConfigError(f"'{where.rstrip('.')}' at line {node.start_mark.line + 1}: YAML reads "
                          f"the unquoted {node.value} as a base-60 number; quote it: "
                          f"\"{node.value}\"")
    if isinstance(node, yaml.ScalarNode) and node.tag == INT_TAG:
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise ConfigError(f"'{where.rstrip('.')}' at line {node.start_mark.line + 1}: an "
                              f"integer of {digits} digits (no config value needs 20)")
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise ConfigError(f"duplicate key '{where}{key}' at line {line} (first at line "
                                  f"{first_line[key]}); a key may appear once")
            first_line[key] = line
            _refuse_duplicate_keys(value_node, f"{where}{key}.")
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_duplicate_keys(item, f"{where.rstrip('.')}[{index}].")


def _read_config_file(path: Path) -> str:
    """The file's text; a directory, a missing file or an unreadable one is a ConfigError."""
    if path.is_dir():
        examples = sorted(path.glob("*.yaml"))
        hint = f", e.g. {examples[0]}" if examples else ""
        raise ConfigError(f"{path}: is a directory; give one YAML config file{hint}")
    try:
        return path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it ({e})") from None
