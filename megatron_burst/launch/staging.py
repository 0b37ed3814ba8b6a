"""Outputs that appear whole or not at all: written under temporary names, renamed on success.

`megatron-burst data` writes a dataset as two files (PREFIX.bin and PREFIX.idx) and, for the
sample, a corpus and a tokenizer folder too. Written in place, a re-run that failed deleted
the previous dataset, and one stopped by SIGTERM left a 0-byte .bin beside the old .idx,
which megatron-core's reader cannot open. Here every output is written under a hidden
temporary name in the folder of its final path (so the rename stays on one file system,
where it is atomic), and ``commit`` renames them all over the final paths with SIGINT and
SIGTERM held back, so a reader sees the whole old set or the whole new one.

An error, SIGINT or SIGTERM before the commit removes the temporary outputs and the
folders the run created, and leaves what was there untouched. Only a SIGKILL or a power
loss can leave a hidden ``.NAME.partial-*`` behind; never a half-written output under its
final name.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Iterator

# What the stopped process exits with, as a shell reports a process SIGTERM ended.
SIGTERM_STATUS = 128 + signal.SIGTERM
PARTIAL_TAG = ".partial-"


class Interrupted(SystemExit):
    """SIGTERM arrived while outputs were being written: unwinds so they are removed."""


def partial_name(final: Path) -> str:
    """The prefix of the hidden temporary names staged for ``final``."""
    return f".{final.name}{PARTIAL_TAG}"


class StagedOutputs:
    """Files and folders written under temporary names, renamed over their final paths
    together by ``commit`` or removed by ``discard``."""

    def __init__(self) -> None:
        self._pairs: list[tuple[Path, Path]] = []  # (temporary, final)
        self._created_folders: list[Path] = []  # made for the outputs, deepest last
        self.committed = False

    def _make_parents(self, final: Path) -> None:
        missing = [p for p in [final.parent, *final.parent.parents] if not p.exists()]
        for folder in reversed(missing):  # outermost first
            folder.mkdir()
            self._created_folders.append(folder)

    def file(self, final: str | os.PathLike) -> Path:
        """A temporary path to write ``final``'s content to (the file exists, empty)."""
        final = Path(final)
        self._make_parents(final)
        handle, name = tempfile.mkstemp(prefix=partial_name(final), dir=final.parent)
        os.close(handle)
        self._pairs.append((Path(name), final))
        return Path(name)

    def folder(self, final: str | os.PathLike) -> Path:
        """A temporary folder to fill in place of ``final``."""
        final = Path(final)
        self._make_parents(final)
        temporary = Path(tempfile.mkdtemp(prefix=partial_name(final), dir=final.parent))
        self._pairs.append((temporary, final))
        return temporary

    def replaced(self) -> list[Path]:
        """The final paths that exist already (the commit replaces them)."""
        return [final for _, final in self._pairs if final.exists() or final.is_symlink()]

    def commit(self) -> None:
        """Rename every temporary output over its final path, with SIGINT/SIGTERM held."""
        blocked = {signal.SIGINT, signal.SIGTERM}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        aside: list[Path] = []
        try:
            for temporary, final in self._pairs:
                if final.is_dir() and not final.is_symlink():
                    # A folder cannot be renamed over a folder that has content: move the old
                    # one aside first, and delete it once the new one is in place.
                    old = Path(tempfile.mkdtemp(prefix=partial_name(final), dir=final.parent))
                    os.replace(final, old / final.name)
                    aside.append(old)
                os.replace(temporary, final)
            self.committed = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for old in aside:
            shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        """Remove the temporary outputs and the folders made for them (if still empty)."""
        for temporary, _ in self._pairs:
            if temporary.is_dir():
                shutil.rmtree(temporary, ignore_errors=True)
            else:
                temporary.unlink(missing_ok=True)
        for folder in reversed(self._created_folders):
            with contextlib.suppress(OSError):  # not empty: something else was put there
                folder.rmdir()


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(128 + signum)


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block SIGTERM raises ``Interrupted``, so ``finally`` and cleanup run.

    Only where SIGTERM still has its default action (which would end the process without
    any cleanup) and in the main thread (the only one Python delivers signals to).
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def staged_outputs() -> Iterator[StagedOutputs]:
    """A ``StagedOutputs`` whose uncommitted outputs are removed however the block ends."""
    stage = StagedOutputs()
    with sigterm_unwinds():
        try:
            yield stage
        finally:
            if not stage.committed:
                stage.discard()
