"""The README and docs/configs.md say what the code does: every config listed, every key
documented, the README's commands run as written (here, or by .ci/run)."""
from __future__ import annotations

import dataclasses
import re
import shlex
import typing

import pytest

from megatron_burst.cli.parser import main
from megatron_burst.launch.config.schema import Config, load_config

from .conftest import CONFIGS, REPO
from .readme_blocks import readme_block

README = (REPO / "README.md").read_text()
CI_BLOCKS = ("install", "text", "test")


def _schema_keys(cls: type = Config, prefix: str = "") -> list[str]:
    keys = []
    for field in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[field.name]
        if dataclasses.is_dataclass(hint):
            keys += _schema_keys(hint, f"{prefix}{field.name}.")
        else:
            keys.append(f"{prefix}{field.name}")
    return keys


def test_docs_describe_every_config_key():
    reference = (REPO / "docs" / "configs.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", reference, re.MULTILINE))
    assert documented == set(_schema_keys())


def _readme_config_rows() -> dict[str, str]:
    """config file name -> its row of the README's config table."""
    rows = {}
    for line in README.splitlines():
        if line.startswith("| `") and ".yaml`" in line.split("|")[1]:
            for name in re.findall(r"`([^`]+\.yaml)`", line.split("|")[1]):
                rows[name] = line
    return rows


def test_readme_lists_every_config_as_it_is():
    rows = _readme_config_rows()
    assert sorted(rows) == sorted(p.name for p in CONFIGS)
    for path in CONFIGS:
        cfg, row = load_config(path), rows[path.name]
        cells = [cell.strip() for cell in row.split("|")]
        p, c = cfg.parallel, cfg.cluster
        assert cells[5].startswith(f"{p.tensor}/{p.context}/{p.pipeline}/{p.data}"), row
        hardware = "CPU ranks" if c.gpu == "cpu" else f"{c.nodes} x {c.gpus_per_node} "
        assert hardware in cells[4] and (c.gpu == "cpu" or c.gpu[:4].upper() in cells[4]), row
        assert ("synthetic" in cells[6]) == cfg.data.mock, row


def test_ci_runs_the_readme_blocks():
    ci = (REPO / ".ci" / "run").read_text()
    for name in CI_BLOCKS:
        assert readme_block(README, name), f"README has no block marked <!-- ci: {name} -->"
        assert f"run_readme_block {name}" in ci
    assert "configs/tiny-llama-cpu.yaml" in readme_block(README, "install")
    assert readme_block(README, "test") == "python -m pytest tests -q"


def _tested_block() -> list[list[str]]:
    """The commands of the README block marked as run by this test, continuations joined."""
    text = README.split("<!-- tested: tests/launch/test_launch_docs.py")[1]
    body = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in body.replace("\\\n", " ").splitlines()
            if line.strip()]


def test_readme_config_commands_run_as_written(tmp_path, monkeypatch, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the README's `run` line would start torchrun on this GPU host")
    (tmp_path / "configs").symlink_to(REPO / "configs")
    monkeypatch.chdir(tmp_path)  # `slurm` writes runs/ here
    commands = _tested_block()
    assert [words[0] for words in commands if "=" not in words[0]] and len(commands) == 5
    for words in commands:
        while "=" in words[0]:  # VAR=value before the command, as the shell reads it
            name, value = words.pop(0).split("=", 1)
            monkeypatch.setenv(name, value)
        assert words[0] == "megatron-burst"
        status = main(words[1:])
        out, err = capsys.readouterr()
        if words[1] == "run":  # no GPU here: the run refuses the GPU config, naming the key
            assert status == 2 and "'cluster.gpu'" in err
        else:
            assert status == 0, (words, err)
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["llama2-70b-128k-4n.sbatch"]


# A number written by hand: digits standing alone ("103 ms", "1.89", "CP=4", "4 GPUs"), not
# inside a name ("Llama-3.2", "A100", "h200x8", "bf16").
HAND_WRITTEN_NUMBER = re.compile(r"(?<![\w.-])\d[\d,.]*(?![\w-])")


def hand_written_numbers(text: str) -> list[str]:
    """Numbers in a config's hand-written header lines (there should be none: a number typed
    there drifts from the code that computes it)."""
    from megatron_burst.tools.config_header import split_header

    hand, _, _ = split_header(text)
    return [n for line in hand for n in HAND_WRITTEN_NUMBER.findall(line)]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_headers_are_the_plans_numbers(path):
    from megatron_burst.tools.config_header import with_generated_block

    text = path.read_text()
    assert with_generated_block(text, load_config(path)) == text, (
        f"the plan's lines in {path.name} are stale: python -m "
        f"megatron_burst.tools.config_header configs/{path.name}")
    assert hand_written_numbers(text) == [], f"{path.name}: numbers written by hand"


def test_config_header_check_catches_drift(tmp_path):
    from megatron_burst.tools.config_header import main as header_main

    text = (REPO / "configs" / "llama3-8b-128k.yaml").read_text()
    edited = tmp_path / "c.yaml"
    edited.write_text(text.replace("GiB of 80 GiB", "GiB of 81 GiB", 1))
    assert header_main(["--check", str(edited)]) == 1
    assert header_main([str(edited)]) == 0 and edited.read_text() == text
    assert hand_written_numbers("# it needs 103 ms, and CP=4\nmodel: {}\n") == ["103", "4"]
    assert hand_written_numbers("# Llama-3.2 on A100 and h200x8 nodes, bf16\nmodel: {}\n") == []


def _docs_rows() -> dict[str, list[str]]:
    """key -> the cells of its row in docs/configs.md."""
    reference = (REPO / "docs" / "configs.md").read_text()
    return {m.group(1): [c.strip() for c in m.group(0).split("|")[2:-1]]
            for m in re.finditer(r"^\| `([a-z0-9_.]+)` \|.*\|$", reference, re.MULTILINE)}


def _default_text(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) and "," in value else str(value)


def test_docs_defaults_and_ranges_are_the_schemas():
    """Every default and range docs/configs.md states is the loader's own."""
    from megatron_burst.launch.config.schema import BOUNDS, CHOICES
    from megatron_burst.launch.planning.plan import HEAD_DIM_MULTIPLE, MAX_HEAD_DIM

    rows = _docs_rows()
    defaults = {}
    for key in _schema_keys():
        section, _, name = key.rpartition(".")
        cls = Config if not section else typing.get_type_hints(Config)[section]
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        defaults[key] = field.default if field.default_factory is dataclasses.MISSING else (
            field.default_factory())
    for key, (kind, limits) in ((k, rows[k][:2]) for k in rows if len(rows[k]) == 3):
        default = kind.split(", ", 1)[1] if ", " in kind else ""
        value = defaults[key]
        if value is dataclasses.MISSING:
            assert default == "required", key
        elif default != "default `seq_length`":
            expected = _default_text(value)
            if isinstance(value, float):
                assert float(default) == value, key
            else:
                assert default.strip('"') == expected.strip("'"), (key, default, expected)
        if key in BOUNDS:
            assert limits == BOUNDS[key].describe(), key
        if key in CHOICES:
            assert limits == ", ".join(CHOICES[key]), key
    hidden = rows["model.hidden_size"][2]
    assert f"a multiple of {HEAD_DIM_MULTIPLE}, at most {MAX_HEAD_DIM}" in hidden
    llama3 = load_config(REPO / "configs" / "llama3-8b-32k.yaml")
    assert f"Llama 3: {llama3.model.rotary_base}" in rows["model.rotary_base"][2]
    tied = load_config(REPO / "configs" / "llama3.2-1b-128k-4gpu.yaml")
    assert f"ties them: {str(tied.model.untie_embeddings).lower()}" in (
        rows["model.untie_embeddings"][2])
