"""Files a command writes for its user (`slurm -o`, `tune --out`): checked before any work,
written whole, never over an existing file without ``--force``.

Before the work: the path must not be a folder, its folder must exist (nothing is created
behind the user's back; the message says how to create it), and an existing file needs
``--force``; a command may also name inputs it reads, which are never replaced, even with
``--force`` (`slurm CONFIG -o CONFIG` would replace the config by the script).

Writing: the text goes to a temporary file beside the target, which is then linked into
place without ``--force`` (a file that appeared meanwhile is not replaced: the link fails)
or renamed over the target with it, so a reader sees the old file or the whole new one.
A new file gets the permissions the umask gives any new file (0644 under umask 022; the
executable bits too where asked for); a replaced one keeps its mode. A target that is no
regular file (``/dev/stdout``, a FIFO) is written in place, as a shell redirection would.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import stat
import tempfile
from pathlib import Path
from typing import Iterable


class OutputError(ValueError):
    """An output path that cannot be written as asked; the message names the option."""


def current_umask() -> int:
    """The process's umask (read by setting it and putting it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode(executable: bool = False) -> int:
    """The mode ``open()`` or a shell would give a new file here: 0666 (0777) minus the umask."""
    return (0o777 if executable else 0o666) & ~current_umask()


def new_folder_mode() -> int:
    """The mode ``mkdir`` would give a new folder here: 0777 minus the umask."""
    return 0o777 & ~current_umask()


def check_output_file(path: str | os.PathLike, option: str, force: bool, *,
                      reads: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuse ``path`` as the output of ``option`` (OutputError, one line) if it is a folder,
    its folder does not exist, it exists and ``force`` is off, or it is one of ``reads``."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{option} {path}: is a folder; give the name of a file (in it, "
                          f"e.g. {path / 'NAME'})")
    folder = path.parent
    if not folder.exists():
        raise OutputError(f"{option} {path}: the folder {folder} does not exist; create it "
                          f"first (mkdir -p {shlex.quote(str(folder))})")
    if not folder.is_dir():
        raise OutputError(f"{option} {path}: {folder} is not a folder")
    for source in reads:
        if path.exists() and Path(source).exists() and path.samefile(source):
            raise OutputError(f"{option} {path}: is the file this command reads; write the "
                              f"output elsewhere")
    if (path.exists() or path.is_symlink()) and not force and _is_regular(path):
        raise OutputError(f"{option} {path}: exists; pass --force to replace it")
    return path


def _is_regular(path: Path) -> bool:
    """A regular file, or a link to one or to nothing (what a write would replace)."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except FileNotFoundError:  # a dangling link
        return True


def write_output_file(path: str | os.PathLike, text: str, option: str, force: bool, *,
                      executable: bool = False) -> None:
    """Write ``text`` to ``path`` whole (see the module docstring); OutputError if a file
    appeared there since the check and ``force`` is off."""
    path = Path(path)
    if path.exists() and not _is_regular(path):  # /dev/stdout, a FIFO: nothing to replace
        with path.open("w") as out:
            out.write(text)
        return
    mode = stat.S_IMODE(path.stat().st_mode) if force and path.is_file() else (
        new_file_mode(executable))
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.partial-", dir=path.parent)
    temporary = Path(name)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        temporary.chmod(mode)
        if force:
            os.replace(temporary, path)
        else:
            _link_new(temporary, path, option)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def _link_new(temporary: Path, path: Path, option: str) -> None:
    """Give ``temporary`` the name ``path`` only if nothing has it: a hard link fails on an
    existing name, where a rename would replace it."""
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise OutputError(f"{option} {path}: exists (it appeared while this command "
                          f"ran); pass --force to replace it") from None
    except OSError:  # a file system without hard links: the check made before must do
        if path.exists() or path.is_symlink():
            raise OutputError(f"{option} {path}: exists; pass --force to replace it") from None
        os.replace(temporary, path)
