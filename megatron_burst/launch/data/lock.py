"""One `megatron-burst data` run per dataset prefix at a time: an advisory lock, and the test
hook that stops a run at a named step of its commit.

The lock is ``fcntl.flock`` on ``.NAME.versions/lock`` beside the dataset (``commit``
keeps the dataset's versions in that folder). It is taken before the run checks whether a
dataset exists and held until the run has committed or given up, so two runs cannot both
decide that nothing is there, nor interleave their commits. A second run does not wait
(tokenizing can take hours, and the first may replace what it would write): it stops at once
and names the run that holds the lock. The kernel drops the lock when the holder dies,
SIGKILL included, so a killed run never blocks the next. The file system must support
flock (local disks and NFS do; Lustre mounted without ``-o flock`` does not): where it
does not, the run refuses rather than write unguarded.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
from pathlib import Path
from typing import Iterator

from .error import DataError

# Test hook: "STEP:SIGNAL" (e.g. "linked-idx:KILL", "locked:STOP") makes the run send
# itself that signal when it reaches STEP, so the fault-injection tests can kill or pause a
# real run between any two operations of its commit. Unset in normal use.
FAULT_ENV = "MEGATRON_BURST_DATA_FAULT"
LOCK_NAME = "lock"


class LockedError(DataError):
    """Another run holds the dataset's lock, or the file system cannot lock."""


def step(name: str) -> None:
    """A named point of the commit; the test hook may stop or kill the run here."""
    spec = os.environ.get(FAULT_ENV, "")
    where, _, signal_name = spec.partition(":")
    if where == name:
        os.kill(os.getpid(), getattr(signal, f"SIG{signal_name or 'KILL'}"))


@contextlib.contextmanager
def locked(folder: Path, prefix: str, folder_mode: int) -> Iterator[None]:
    """Hold the lock of the dataset whose versions live in ``folder`` (made, with
    ``folder_mode``, if missing)."""
    for _ in range(8):  # a run that removed an empty folder meanwhile: lock the new one
        _make_folder(folder, folder_mode)
        handle = _open_lock(folder / LOCK_NAME, prefix, folder_mode & 0o666)
        if _still_there(handle, folder / LOCK_NAME):
            break
        os.close(handle)
    else:
        raise LockedError(f"{prefix}: its lock file {folder / LOCK_NAME} keeps being removed "
                          f"by another run; try again")
    with contextlib.suppress(OSError):  # opened read-only (another user's lock file)
        os.ftruncate(handle, 0)
        os.write(handle, f"{os.getpid()}\n".encode())
    try:
        yield
    finally:
        os.close(handle)  # releases the lock


def _make_folder(folder: Path, mode: int) -> None:
    try:
        folder.mkdir()
    except FileExistsError:
        if not folder.is_dir() or folder.is_symlink():
            raise LockedError(f"{folder} exists and is not a folder; megatron-burst data "
                              f"keeps the dataset's versions there: move it away") from None
        return
    folder.chmod(mode)  # mkdir applied the umask; the dataset's readers need this mode


def _open_lock(path: Path, prefix: str, mode: int) -> int:
    try:
        handle = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    except PermissionError:  # another user's lock file: flock needs only a reader
        handle = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(handle)
        os.close(handle)
        raise LockedError(f"{prefix}: another `megatron-burst data` run{holder} is writing "
                          f"this dataset; wait for it to finish, then run again") from None
    except OSError as e:
        os.close(handle)
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise LockedError(f"{prefix}: cannot lock {path} ({e.strerror}): the file system "
                              f"does not support flock, and without it two runs could mix "
                              f"their files; write the dataset on another file system") from None
        raise
    return handle


def _holder(handle: int) -> str:
    """' (pid N)' from the lock file, or '' if it holds no pid yet."""
    text = os.pread(handle, 32, 0).decode(errors="replace").strip()
    return f" (pid {text})" if text.isdigit() else ""


def _still_there(handle: int, path: Path) -> bool:
    """Whether the locked file is still the one at ``path`` (not removed and made anew)."""
    try:
        return os.stat(path).st_ino == os.fstat(handle).st_ino
    except FileNotFoundError:
        return False
