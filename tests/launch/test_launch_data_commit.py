"""A `megatron-burst data` commit killed at any step, and runs racing on one prefix: every
reader then sees one whole dataset (the old or the new) or a clear error, never a mix.

Each run is a real process: forked from this one (the imports are already done, so dozens of
runs take seconds) or, once, the console command itself. ``MEGATRON_BURST_DATA_FAULT``
("STEP:SIGNAL") makes the run send itself SIGKILL (or SIGSTOP, to hold it) at a named step.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("tokenizers", reason="the data path needs the `data` extra: tokenizers")
pytest.importorskip("megatron.core")

from megatron_burst.cli.parser import main  # noqa: E402
from megatron_burst.launch.data.lock import FAULT_ENV  # noqa: E402
from megatron_burst.launch.data.sample import write_sample  # noqa: E402

from .conftest import REPO  # noqa: E402
from .datasets import (as_plain_files, assert_no_leftovers, contents,  # noqa: E402
                       reader_sees, write_corpus)

OLD_TEXTS = ["the old dataset, first document", "old second", "old third and last"]
NEW_TEXTS = [f"new document number {i} with some more words" for i in range(40)]
# The steps each kind of prefix goes through (dataset_commit's docstring).
STEPS = {
    "plain": ["locked", "built", "snapshot", "adopted", "linked-idx", "linked-bin", "switched",
              "cleaned"],
    "versioned": ["locked", "built", "switched", "cleaned"],
    "empty": ["locked", "built", "linked-idx", "linked-bin", "switched", "cleaned"],
}
CASES = [(start, step) for start, steps in STEPS.items() for step in steps]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tokenizer, and the old and the new dataset as references (with their contents)."""
    root = tmp_path_factory.mktemp("commit")
    tokenizer = write_sample(root / "sample").dataset.tokenizer.path
    refs = {}
    for name, texts in (("old", OLD_TEXTS), ("new", NEW_TEXTS)):
        corpus = write_corpus(root / f"{name}.jsonl", texts)
        assert main(["data", str(corpus), "--tokenizer", tokenizer, "-o",
                     str(root / f"ref-{name}")]) == 0
        refs[name] = (corpus, contents(root / f"ref-{name}"))
    assert refs["old"][1] != refs["new"][1]
    return tokenizer, refs, root


def _run(argv: list[str], fault: str | None) -> None:
    if fault:
        os.environ[FAULT_ENV] = fault
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # a forked child of a process that used it
    sys.stdout = open(os.devnull, "w")
    sys.stderr = open(os.devnull, "w")
    os._exit(main(argv))


def _start(argv: list[str], fault: str | None = None) -> multiprocessing.Process:
    process = multiprocessing.get_context("fork").Process(target=_run, args=(argv, fault))
    process.start()
    return process


def _argv(made, prefix, name: str = "new", force: bool = True) -> list[str]:
    tokenizer, refs, _ = made
    return ["data", str(refs[name][0]), "--tokenizer", tokenizer, "-o", str(prefix),
            *(["--force"] if force else [])]


def _prefix_as(made, start: str, tmp_path):
    """A prefix holding the old dataset as plain files, as this tool's versions, or nothing."""
    _, refs, root = made
    prefix = tmp_path / "docs"
    if start == "plain":
        as_plain_files(root / "ref-old", prefix)
    elif start == "versioned":
        assert main(_argv(made, prefix, "old", force=False)) == 0
    return prefix


# A reader of a prefix with no dataset yet: megatron-core's __del__ then trips on the
# object its failed __init__ left half made.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("start, step", CASES, ids=[f"{s}-{t}" for s, t in CASES])
def test_a_kill_at_any_step_leaves_a_whole_dataset(made, tmp_path, start, step):
    _, refs, _ = made
    old, new = refs["old"][1], refs["new"][1]
    prefix = _prefix_as(made, start, tmp_path)
    run = _start(_argv(made, prefix), f"{step}:KILL")
    run.join(120)
    assert run.exitcode == -signal.SIGKILL, f"not killed at {step}"
    seen = reader_sees(prefix)
    if start == "empty":
        assert seen == new if step == "cleaned" or step == "switched" else (
            isinstance(seen, str) and "cannot be found" in seen), seen
    else:
        assert seen in (old, new), seen
        assert (seen == new) == (step in ("switched", "cleaned")), step
    # The next run finds what the killed one left and needs --force only if a dataset is
    # there; it commits whole and cleans up.
    has_dataset = not isinstance(seen, str)
    assert main(_argv(made, prefix, force=False)) == (2 if has_dataset else 0)
    assert main(_argv(made, prefix)) == 0
    assert contents(prefix) == new
    assert_no_leftovers(prefix)


def test_the_console_command_is_killed_between_its_links(made, tmp_path):
    """The real command, started as users start it, killed after replacing one plain file."""
    _, refs, _ = made
    prefix = _prefix_as(made, "plain", tmp_path)
    env = {**os.environ, FAULT_ENV: "linked-idx:KILL", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "megatron_burst.cli",
                           *_argv(made, prefix)], env=env, capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert (prefix.parent / "docs.idx").is_symlink() and not (prefix.parent / "docs.bin"
                                                              ).is_symlink()
    assert contents(prefix) == refs["old"][1]


def _wait_stopped(pid: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.05)
    raise AssertionError(f"run {pid} did not stop")


@pytest.mark.parametrize("held_at", ["locked", "built"])
def test_a_second_run_is_refused_while_one_writes(made, tmp_path, capsys, held_at):
    """Run A holds the prefix (stopped right after locking, or with its version built); run
    B, with --force or without, stops at once, naming A; A then commits; B without --force
    is refused because A's dataset is there."""
    _, refs, _ = made
    prefix = tmp_path / "docs"
    first = _start(_argv(made, prefix, "old", force=False), f"{held_at}:STOP")
    try:
        _wait_stopped(first.pid)
        for force in (False, True):
            assert main(_argv(made, prefix, force=force)) == 2
            err = capsys.readouterr().err
            assert len(err.splitlines()) == 1, err
            assert f"another `megatron-burst data` run (pid {first.pid})" in err, err
    finally:
        os.kill(first.pid, signal.SIGCONT)
        first.join(120)
    assert first.exitcode == 0
    assert contents(prefix) == refs["old"][1]
    assert main(_argv(made, prefix, force=False)) == 2
    assert "pass --force to replace it" in capsys.readouterr().err
    assert_no_leftovers(prefix)


def test_runs_started_together_never_mix(made, tmp_path):
    """Two --force runs on one prefix at once, a few times: each commits whole or is
    refused; the prefix holds the last committed dataset, never a mix."""
    _, refs, _ = made
    prefix = tmp_path / "docs"
    for round_ in range(3):
        runs = {name: _start(_argv(made, prefix, name)) for name in ("old", "new")}
        for run in runs.values():
            run.join(120)
        codes = {name: run.exitcode for name, run in runs.items()}
        assert set(codes.values()) <= {0, 2} and 0 in codes.values(), codes
        assert reader_sees(prefix) in [refs[n][1] for n, code in codes.items() if code == 0]
        assert_no_leftovers(prefix)


def test_a_sample_switched_in_half_is_not_kept(made, tmp_path, capsys):
    """`data --sample-corpus --force --vocab-size 300` killed after the corpus and tokenizer
    are renamed in but before the dataset's switch: the new 300-token tokenizer sits beside
    the old dataset (ids up to 1023). `--keep-existing` must refuse to call that complete;
    --force then makes a whole sample that it keeps."""
    folder = tmp_path / "sample"
    assert main(["data", "--sample-corpus", str(folder)]) == 0  # 1024 tokens
    assert main(["data", "--sample-corpus", str(folder), "--keep-existing"]) == 0
    assert "kept" in capsys.readouterr().out
    small = ["data", "--sample-corpus", str(folder), "--vocab-size", "300"]
    run = _start([*small, "--force"], "sample-staged:KILL")
    run.join(300)
    assert run.exitcode == -signal.SIGKILL, "not killed between the parts' renames"
    capsys.readouterr()
    assert main([*small, "--keep-existing"]) == 2
    said = capsys.readouterr().err
    assert "sample.json" in said and "--force" in said, said
    assert main([*small, "--force"]) == 0
    assert main([*small, "--keep-existing"]) == 0
    assert "300 tokens" in capsys.readouterr().out


def test_a_sample_part_changed_afterwards_is_not_kept(made, tmp_path, capsys):
    """A part replaced by hand (the tokenizer of another sample) breaks what sample.json
    binds: --keep-existing names the part instead of keeping a mismatched sample."""
    one, other = tmp_path / "one", tmp_path / "other"
    assert main(["data", "--sample-corpus", str(one)]) == 0
    assert main(["data", "--sample-corpus", str(other), "--vocab-size", "300"]) == 0
    (one / "tokenizer" / "tokenizer.json").write_bytes(
        (other / "tokenizer" / "tokenizer.json").read_bytes())
    capsys.readouterr()
    assert main(["data", "--sample-corpus", str(one), "--keep-existing"]) == 2
    assert "tokenizer/tokenizer.json" in capsys.readouterr().err
