"""Outputs that appear whole or not at all: written under temporary names, renamed on success.

`megatron-burst data --sample-corpus` writes a corpus file and a tokenizer folder beside its
dataset (which ``commit`` commits). Each is written under a hidden temporary name
in the folder of its final path (so the rename stays on one file system, where it is
atomic), and ``commit`` renames each over its final path with SIGINT and SIGTERM held back:
a reader sees the old file (folder) or the whole new one.

An error, SIGINT or SIGTERM before the commit removes the temporary outputs and the
folders the run created, and leaves what was there untouched. Only a SIGKILL or a power
loss can leave a hidden ``.NAME.partial-*`` behind; never a half-written output under its
final name.

What is replaced is checked first (``check_replaceable``): an existing output needs
``force``; a file never replaces a folder, nor a folder a file; and a folder is replaced only
if it holds nothing but the files this tool writes there, so no file of the user's is ever
deleted. New outputs get the permissions the umask gives any new file or folder; a replaced
one keeps its mode.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from ..output_files import new_file_mode, new_folder_mode

# What the stopped process exits with, as a shell reports a process SIGTERM ended.
SIGTERM_STATUS = 128 + signal.SIGTERM
PARTIAL_TAG = ".partial-"


class Interrupted(SystemExit):
    """SIGTERM arrived while outputs were being written: unwinds so they are removed."""


def partial_name(final: Path) -> str:
    """The prefix of the hidden temporary names staged for ``final``."""
    return f".{final.name}{PARTIAL_TAG}"


def check_replaceable(final: Path, force: bool, folder_files: tuple[str, ...] | None = None
                      ) -> None:
    """Refuse (ValueError, one line) to replace ``final`` as the module docstring says; a
    folder output names the files it writes in ``folder_files``, a file output None."""
    if not (final.exists() or final.is_symlink()):
        return
    if folder_files is None and final.is_dir():
        raise ValueError(f"{final} is a folder; a file is written there, and no folder is "
                         f"ever deleted, --force or not: move it away")
    if folder_files is not None:
        if not final.is_dir() or final.is_symlink():
            raise ValueError(f"{final} exists and is not a folder; move it away")
        foreign = sorted(p.name for p in final.iterdir() if p.name not in folder_files)
        if foreign:
            raise ValueError(f"{final} holds {', '.join(foreign[:3])}, which this tool does "
                             f"not write there; it replaces the folder only when it holds "
                             f"nothing else, --force or not: move them away")
    if not force:
        raise ValueError(f"{final} exists; pass --force to replace it")


def _mode_for(temporary: Path, final: Path) -> int:
    """The replaced output's mode, or what the umask gives a new file or folder."""
    if final.exists() and final.is_dir() == temporary.is_dir():
        return stat.S_IMODE(final.stat().st_mode)
    return new_folder_mode() if temporary.is_dir() else new_file_mode()


class StagedOutputs:
    """Files and folders written under temporary names, renamed over their final paths
    together by ``commit`` or removed by ``discard``."""

    def __init__(self) -> None:
        self._pairs: list[tuple[Path, Path]] = []  # (temporary, final)
        self._folder_files: dict[Path, tuple[str, ...]] = {}  # what a folder output holds
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

    def folder(self, final: str | os.PathLike, files: tuple[str, ...]) -> Path:
        """A temporary folder to fill with ``files`` in place of ``final``."""
        final = Path(final)
        self._make_parents(final)
        temporary = Path(tempfile.mkdtemp(prefix=partial_name(final), dir=final.parent))
        self._pairs.append((temporary, final))
        self._folder_files[final] = files
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
                temporary.chmod(_mode_for(temporary, final))
                if final.is_dir() and not final.is_symlink():
                    # A folder cannot be renamed over a folder that has content: move the old
                    # one aside first, and delete it once the new one is in place.
                    check_replaceable(final, True, self._folder_files.get(final))
                    old = Path(tempfile.mkdtemp(prefix=partial_name(final), dir=final.parent))
                    os.replace(final, old / final.name)
                    aside.append((old, final))
                os.replace(temporary, final)
            self.committed = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for old, final in aside:  # only the files this tool wrote there (checked above)
            for name in self._folder_files.get(final, ()):
                (old / final.name / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                (old / final.name).rmdir()
                old.rmdir()

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
