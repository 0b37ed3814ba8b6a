"""How `megatron-burst data` puts a dataset at PREFIX so that a reader sees a whole one.

Megatron reads a dataset as two files, PREFIX.idx and PREFIX.bin, opened by name
(megatron-core's ``IndexedDataset(PREFIX)``). Renaming two new files over two old ones cannot
be atomic: a SIGKILL between the renames left the new .bin beside the old .idx, a readable,
wrong dataset. So each version's two files are written into a folder of their own, and one
symbolic link chooses the version:

    D/N.bin -> .N.versions/current/N.bin      made once; the paths Megatron opens
    D/N.idx -> .N.versions/current/N.idx
    D/.N.versions/current -> v-XXXXXXXX       the switch: one rename, atomic
    D/.N.versions/v-XXXXXXXX/N.bin, N.idx     a version
    D/.N.versions/lock                        one run at a time (``lock``)

A run takes the lock, checks (under it) what exists, builds its version, then renames a new
``current`` link over the old one: before that rename every reader sees the old dataset,
after it the new one. A dataset made otherwise (plain files, from Megatron's
preprocess_data.py or an earlier release of this tool) is first adopted without changing
what its readers see: its files are hard-linked into a version of their own (a link to a
link's target; copied where hard links fail), ``current`` points there, and each plain file
is replaced by its link, which leads to the same bytes. Then the switch.

The steps, in order (``dataset_lock.step`` names them for the fault-injection tests):
locked, built, [snapshot, adopted,] linked-idx, linked-bin, switched, cleaned. Killed at any
of them, the prefix holds the old dataset, the new one, or (a first write not yet switched)
none, which Megatron reports as missing files. A killed run's leftovers (its version folder,
a temporary link) are removed by the next run, under the lock. Nothing else is deleted: a
folder where PREFIX.bin or PREFIX.idx should be is refused, ``--force`` or not.

What no arrangement of two files can give: Megatron opens PREFIX.idx and PREFIX.bin one after
the other, so a reader that starts in the instant of a switch, between its two opens, can
pair an old .idx with a new .bin. Replace a dataset while no job is starting on it; jobs
already reading keep the files they opened (a replaced version is unlinked, not rewritten).

Permissions: a new dataset gets what the umask gives any new file (files 0666 and folders
0777, minus the umask); a replaced one keeps the mode of the files it replaces (its folders
get the matching search bits), so the other readers of a shared dataset keep their access.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from .error import DataError
from .lock import LOCK_NAME, locked, step
from ..output_files import new_file_mode, new_folder_mode
from .staging import sigterm_unwinds

CURRENT, VERSION_TAG, TEMP_TAG = "current", "v-", ".link-"
SUFFIXES = (".idx", ".bin")  # the order the links are made in


class DatasetPaths:
    """The names around the dataset at ``prefix`` (see the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.folder = Path(os.path.dirname(prefix) or ".")
        self.name = os.path.basename(prefix)
        self.versions = self.folder / f".{self.name}.versions"

    def file(self, suffix: str) -> Path:
        return Path(self.prefix + suffix)

    def link_target(self, suffix: str) -> str:
        return f"{self.versions.name}/{CURRENT}/{self.name}{suffix}"

    def is_ours(self, suffix: str) -> bool:
        path = self.file(suffix)
        return path.is_symlink() and os.readlink(path) == self.link_target(suffix)

    def current(self) -> str | None:
        """The version folder ``current`` names, or None before the first switch."""
        link = self.versions / CURRENT
        return os.readlink(link) if link.is_symlink() else None


def check_prefix(prefix: str) -> None:
    """Refuse a prefix that is no dataset name in an existing folder (DataError, one line)."""
    if prefix.endswith((".bin", ".idx")):
        raise DataError(f"--output-prefix {prefix}: give the prefix without .bin or .idx "
                        f"(it writes PREFIX.bin and PREFIX.idx)")
    name = os.path.basename(prefix)
    if name in ("", ".", ".."):
        raise DataError(f"--output-prefix {prefix}: names a folder, not a dataset; give "
                        f"FOLDER/NAME, e.g. {os.path.join(prefix, 'text_document')} (which "
                        f"writes text_document.bin and .idx there)")
    folder = Path(os.path.dirname(prefix) or ".")
    if not folder.exists():
        raise DataError(f"--output-prefix {prefix}: the folder {folder} does not exist; "
                        f"create it first (mkdir -p {shlex.quote(str(folder))})")
    if not folder.is_dir():
        raise DataError(f"--output-prefix {prefix}: {folder} is not a folder")


def existing_dataset(prefix: str, force: bool) -> list[Path]:
    """The dataset files at ``prefix`` a commit would replace (this tool's links that lead
    nowhere yet do not count); without ``force`` any is refused, and a folder always is."""
    paths = DatasetPaths(prefix)
    found = []
    for suffix in (".bin", ".idx"):
        path = paths.file(suffix)
        if path.is_dir():  # a folder, or a link to one
            raise DataError(f"{path} is a folder: megatron-burst data writes a file there and "
                            f"never deletes a folder, --force or not; move it away or choose "
                            f"another --output-prefix")
        if path.exists() or (path.is_symlink() and not paths.is_ours(suffix)):
            found.append(path)
    if found and not force:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise DataError(f"{found[0]} exists{more}; pass --force to replace it")
    return found


class DatasetCommit:
    """A version being built (``bin_path``, ``idx_path``), and the switch that commits it."""

    def __init__(self, paths: DatasetPaths, version: Path, modes: tuple[int, int],
                 replaced: bool) -> None:
        self.paths, self.version, self.replaced = paths, version, replaced
        self.file_mode, self.folder_mode = modes
        self.bin_path = version / f"{paths.name}.bin"
        self.idx_path = version / f"{paths.name}.idx"
        self.committed = False

    def commit(self) -> None:
        """Make the built version the dataset at the prefix (see the module docstring), with
        SIGINT and SIGTERM held until it is done: a stop then comes after the switch, not
        between it and the record that it happened."""
        blocked = {signal.SIGINT, signal.SIGTERM}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            self._commit()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _commit(self) -> None:
        for path in (self.bin_path, self.idx_path):
            path.chmod(self.file_mode)
            _fsync(path)
        _fsync(self.version)
        step("built")
        if not all(self.paths.is_ours(suffix) for suffix in SUFFIXES):
            self._adopt()
        _switch(self.paths.versions / CURRENT, self.version.name)
        _fsync(self.paths.versions)
        self.committed = True
        step("switched")
        _remove_leftovers(self.paths)  # every other version (under the lock: none is in use)
        step("cleaned")

    def _adopt(self) -> None:
        """Put the prefix's files behind this tool's links, readers seeing the same data."""
        p = self.paths
        plain = [p.file(s) for s in SUFFIXES if not p.is_ours(s) and p.file(s).exists()]
        if len(plain) == len(SUFFIXES):  # a whole dataset: keep it readable throughout
            snapshot = Path(tempfile.mkdtemp(prefix=VERSION_TAG, dir=p.versions))
            snapshot.chmod(self.folder_mode)
            for source in plain:
                _keep(source, snapshot / source.name)
            _fsync(snapshot)
            step("snapshot")
            _switch(p.versions / CURRENT, snapshot.name)
            step("adopted")
        for suffix in SUFFIXES:
            if not p.is_ours(suffix):
                _switch(p.file(suffix), p.link_target(suffix))
            step(f"linked-{suffix[1:]}")
        _fsync(p.folder)


def _keep(source: Path, copy: Path) -> None:
    """``copy`` holds what ``source`` holds, without copying where it can be helped."""
    if source.is_symlink():  # someone's link to their data: lead to the same file
        os.symlink(os.path.realpath(source), copy)
        return
    try:
        os.link(source, copy)
    except OSError:  # a file system without hard links
        shutil.copyfile(source, copy)
        copy.chmod(stat.S_IMODE(source.stat().st_mode))


def _switch(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` in one rename (a new link is renamed over the old)."""
    temporary = link.parent / f".{link.name}{TEMP_TAG}{os.getpid()}-{secrets.token_hex(4)}"
    os.symlink(target, temporary)
    try:
        os.replace(temporary, link)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _fsync(path: Path) -> None:
    """Flush a file or folder to disk, so a power loss after the switch keeps the data. A
    folder that cannot be opened for reading is left to the file system's next sync."""
    try:
        handle = os.open(path, os.O_RDONLY)
    except PermissionError:
        if path.is_dir():
            return
        raise
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def remove_version(paths: DatasetPaths, version: Path) -> None:
    """Delete a version folder of this tool: its two files, then the folder if empty (a file
    someone else put there is left, and so is the folder)."""
    for suffix in SUFFIXES:
        (version / f"{paths.name}{suffix}").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        version.rmdir()


def _remove_leftovers(paths: DatasetPaths) -> None:
    """What killed runs left: versions that ``current`` does not name, temporary links."""
    current = paths.current()
    for version in paths.versions.glob(f"{VERSION_TAG}*"):
        if version.name != current and version.is_dir() and not version.is_symlink():
            remove_version(paths, version)
    for folder, name in [(paths.versions, CURRENT),
                         *((paths.folder, f"{paths.name}{s}") for s in SUFFIXES)]:
        for link in folder.glob(f".{name}{TEMP_TAG}*"):
            if link.is_symlink():
                link.unlink()


def _modes(paths: DatasetPaths) -> tuple[int, int]:
    """(file mode, folder mode) for the new version (see the module docstring)."""
    old = paths.file(".bin")
    if not old.is_file():
        return new_file_mode(), new_folder_mode()
    mode = stat.S_IMODE(old.stat().st_mode)
    return mode, mode | (mode & 0o444) >> 2 | 0o700  # search where read; the owner manages


@contextlib.contextmanager
def dataset_commit(prefix: str, force: bool) -> Iterator[DatasetCommit]:
    """Lock the prefix, check it, and yield a ``DatasetCommit`` to build; a block that ends
    without ``commit()`` leaves the prefix as it was."""
    check_prefix(prefix)
    existing_dataset(prefix, force)  # before the lock too: a refused run leaves nothing
    paths = DatasetPaths(prefix)
    modes = _modes(paths)
    with sigterm_unwinds(), locked(paths.versions, prefix, modes[1]):
        commit = None
        try:
            replaced = bool(existing_dataset(prefix, force))  # the check that counts
            _remove_leftovers(paths)
            version = Path(tempfile.mkdtemp(prefix=VERSION_TAG, dir=paths.versions))
            version.chmod(modes[1])
            commit = DatasetCommit(paths, version, modes, replaced)
            step("locked")
            yield commit
        finally:
            if commit is None or not commit.committed:
                if commit is not None:
                    remove_version(paths, commit.version)
                if paths.current() is None:
                    _remove_unused(paths)


def _remove_unused(paths: DatasetPaths) -> None:
    """Where no version was ever committed: this tool's links (leading nowhere), the lock
    file and the versions folder, if nothing else is in it."""
    for suffix in SUFFIXES:
        if paths.is_ours(suffix):
            paths.file(suffix).unlink()
    with contextlib.suppress(OSError):
        (paths.versions / LOCK_NAME).unlink()
        paths.versions.rmdir()
