"""What the commands write and where: `data` never deletes a folder and never makes one the
user did not ask for, every output gets the umask's permissions (a replaced dataset keeps its
mode), and `slurm -o` / `tune --out` never replace a file without --force."""
from __future__ import annotations

import os
import stat

import pytest

from megatron_burst.cli.parser import main

from .conftest import REPO

CONFIG = REPO / "configs" / "llama3-8b-32k.yaml"


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set the process's umask for one test."""
    before = os.umask(0o022)
    yield os.umask
    os.umask(before)


def _one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


# ---------------------------------------------------------------------------- data

@pytest.fixture(scope="module")
def data_made(tmp_path_factory):
    pytest.importorskip("tokenizers", reason="the data path needs the `data` extra")
    pytest.importorskip("megatron.core")
    from megatron_burst.launch.data.sample import write_sample

    from .datasets import write_corpus

    root = tmp_path_factory.mktemp("outputs")
    tokenizer = write_sample(root / "sample").dataset.tokenizer.path
    return tokenizer, write_corpus(root / "c.jsonl", ["one text", "another text"])


def _data(data_made, prefix, *extra: str) -> int:
    tokenizer, corpus = data_made
    return main(["data", str(corpus), "--tokenizer", tokenizer, "-o", str(prefix), *extra])


@pytest.mark.parametrize("as_link", [False, True])
def test_force_never_deletes_a_folder_at_the_prefix(data_made, tmp_path, capsys, as_link):
    folder = tmp_path / "precious"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    if as_link:
        (tmp_path / "docs.bin").symlink_to(folder)
    else:
        folder.rename(tmp_path / "docs.bin")
        folder = tmp_path / "docs.bin"
    assert _data(data_made, tmp_path / "docs", "--force") == 2
    _one_line_error(capsys, "docs.bin is a folder", "never deletes a folder")
    assert (folder / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "docs.idx").exists()


@pytest.mark.parametrize("prefix, needle", [
    ("data/", "names a folder, not a dataset"),
    ("data/.", "names a folder, not a dataset"),
    ("missing/deeper/docs", "the folder missing/deeper does not exist; create it first "
                            "(mkdir -p missing/deeper)"),
    ("afile/docs", "afile is not a folder"),
])
def test_prefix_must_name_a_dataset_in_an_existing_folder(data_made, tmp_path, capsys,
                                                          monkeypatch, prefix, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "afile").write_text("")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert _data(data_made, prefix) == 2
    _one_line_error(capsys, f"--output-prefix {prefix}", needle)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing hidden, no folder


@pytest.mark.parametrize("mask, files, folders", [(0o022, 0o644, 0o755),
                                                  (0o002, 0o664, 0o775),
                                                  (0o077, 0o600, 0o700)])
def test_outputs_get_the_umasks_permissions(data_made, tmp_path, umask, mask, files, folders):
    umask(mask)
    prefix = tmp_path / "docs"
    assert _data(data_made, prefix) == 0
    versions = tmp_path / ".docs.versions"
    current = versions / os.readlink(versions / "current")
    assert [_mode(prefix.with_suffix(s)) for s in (".bin", ".idx")] == [files, files]
    assert [_mode(versions), _mode(current)] == [folders, folders]
    from megatron_burst.launch.data.sample import write_sample

    sample = write_sample(tmp_path / "s").corpus.parent
    assert _mode(sample) == folders and _mode(sample / "tokenizer") == folders
    for name in ("corpus.jsonl", "tokenizer/tokenizer.json", "text_document.bin"):
        assert _mode(sample / name) == files, name


def test_force_keeps_the_mode_of_the_dataset_it_replaces(data_made, tmp_path, umask):
    """A shared 0644 dataset stays readable by its other users when its owner, with umask
    077, replaces it; plain files from elsewhere too."""
    umask(0o022)
    prefix = tmp_path / "docs"
    assert _data(data_made, prefix) == 0
    os.chmod(prefix.with_suffix(".bin"), 0o640)
    os.chmod(prefix.with_suffix(".idx"), 0o640)
    umask(0o077)
    assert _data(data_made, prefix, "--force") == 0
    versions = tmp_path / ".docs.versions"
    current = versions / os.readlink(versions / "current")
    assert [_mode(prefix.with_suffix(s)) for s in (".bin", ".idx")] == [0o640, 0o640]
    assert _mode(current) & 0o050 == 0o050  # the group may still search the version folder


# ---------------------------------------------------------------------------- slurm, tune

@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _slurm(*extra: str) -> int:
    return main(["slurm", str(CONFIG), "--time", "01:00:00", *extra])


def test_slurm_refuses_to_replace_a_file_without_force(in_tmp, capsys):
    (in_tmp / "job.sh").write_text("my own script\n")
    os.chmod(in_tmp / "job.sh", 0o700)
    assert _slurm("-o", "job.sh") == 2
    _one_line_error(capsys, "-o job.sh: exists; pass --force to replace it")
    assert (in_tmp / "job.sh").read_text() == "my own script\n"
    assert _slurm("-o", "job.sh", "--force") == 0
    assert (in_tmp / "job.sh").read_text().startswith("#!/bin/bash")
    assert _mode(in_tmp / "job.sh") == 0o700  # a replaced file keeps its mode
    capsys.readouterr()
    assert _slurm() == 0  # the default place: the same rule
    assert _slurm() == 2
    _one_line_error(capsys, "runs/llama3-8b-32k-1n.sbatch: exists; pass --force")


def test_slurm_never_replaces_its_config(in_tmp, capsys):
    config = in_tmp / "cfg.yaml"
    config.write_text(CONFIG.read_text())
    assert main(["slurm", str(config), "--time", "01:00:00", "-o", str(config), "--force"]) == 2
    _one_line_error(capsys, "is the file this command reads")
    assert config.read_text() == CONFIG.read_text()


@pytest.mark.parametrize("output, needle", [
    (".", "is a folder; give the name of a file"),
    ("runs", "is a folder; give the name of a file"),
    ("nowhere/job.sh", "the folder nowhere does not exist; create it first (mkdir -p nowhere)"),
])
def test_slurm_output_must_be_a_file_in_an_existing_folder(in_tmp, capsys, output, needle):
    (in_tmp / "runs").mkdir()
    assert _slurm("-o", output) == 2
    _one_line_error(capsys, needle)
    assert not (in_tmp / "nowhere").exists()


@pytest.mark.parametrize("mask, mode", [(0o022, 0o755), (0o077, 0o700)])
def test_slurm_script_gets_the_umasks_permissions(in_tmp, umask, mask, mode):
    umask(mask)
    assert _slurm("-o", "job.sh") == 0
    assert _mode(in_tmp / "job.sh") == mode


def test_slurm_writes_to_a_device(in_tmp, capsys):
    assert _slurm("-o", "/dev/null") == 0  # no file to replace: written as `>` would


@pytest.mark.parametrize("setup, out, needle", [
    ("file", "p.json", "--out p.json: exists; pass --force to replace it"),
    ("raw", "p.json", "--out (its raw measurements) p.raw.json: exists"),
    (None, "nowhere/p.json", "the folder nowhere does not exist; create it first"),
    (None, ".", "--out .: is a folder"),
])
def test_tune_checks_its_output_before_measuring(in_tmp, capsys, setup, out, needle):
    if setup == "file":
        (in_tmp / "p.json").write_text("{}")
    elif setup == "raw":
        (in_tmp / "p.raw.json").write_text("{}")
    assert main(["tune", "--out", out, "--quick"]) == 2
    _one_line_error(capsys, needle)
    assert "torch.distributed.run" not in capsys.readouterr().out  # nothing was started


def test_tune_on_its_ranks_refuses_on_every_rank(in_tmp, capsys, monkeypatch):
    """Started under torchrun directly: rank 0 checks, and every rank stops (none hangs)."""
    import torch.distributed as dist

    from megatron_burst.tools import tune

    (in_tmp / "p.json").write_text("{}")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        assert tune.main(["--out", "p.json", "--quick"]) == 2
    finally:
        dist.destroy_process_group()
    _one_line_error(capsys, "megatron-burst tune: --out p.json: exists")
    assert (in_tmp / "p.json").read_text() == "{}"
