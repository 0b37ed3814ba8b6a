"""Checkpoint retention for a SLURM run: keep the newest checkpoints the run saved (and, if
asked, every one at a multiple of an iteration count); delete the rest of what it saved,
and nothing else.

Megatron saves into one folder (``--save``): a folder ``iter_0000100`` per checkpoint, and,
once a save is complete on every rank, the iteration in ``latest_checkpointed_iteration.txt``
(the tracker). One training process saves one checkpoint after the other, each finished
(its tracker written) before the next begins, at iterations above the one it resumed from.

The sbatch script runs ``watch`` beside each allocation's training (standard library only:
it starts before anything else is imported). It keeps a ledger, a text file in the run's
folder, of what the run did:

- ``written N``: ``iter_N`` appeared while this run trained, above the iteration the
  allocation resumed from. Folders that were there before (copied in, another run's) are
  never written into the ledger, so never deleted.
- ``complete N``: the tracker named N, or ``iter_N`` appeared during this allocation and the
  tracker has since reached N or beyond (saves finish in order).
- ``deleted N``.

A written checkpoint is deleted when its iteration is below the tracker's (a newer save is
complete; Megatron writes only above the tracker's iteration, so it is not being written)
and it is not kept: the newest ``keep_last`` complete ones and, with ``keep_every``, each
complete one whose iteration is a multiple of it. An incomplete one below the tracker (a
save cut off by the end of an allocation) is deleted and never counted as kept. Deleting
renames the folder out of Megatron's naming first, so no reader meets half a checkpoint.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"
CHECKPOINT = re.compile(r"iter_(\d{7,})")
DELETING = ".deleting-"


def tracker_iteration(ckpt_dir: Path) -> int | None:
    """The iteration Megatron's tracker names (None: no tracker, or 'release')."""
    try:
        text = (ckpt_dir / TRACKER).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def checkpoint_iterations(ckpt_dir: Path) -> set[int]:
    """The iterations of the checkpoint folders in ``ckpt_dir``."""
    try:
        names = os.listdir(ckpt_dir)
    except OSError:
        return set()
    return {int(m.group(1)) for m in map(CHECKPOINT.fullmatch, names) if m}


@dataclasses.dataclass
class Ledger:
    """What the run wrote, completed and deleted (one ``state N`` line per event)."""

    path: Path
    written: set[int] = dataclasses.field(default_factory=set)
    complete: set[int] = dataclasses.field(default_factory=set)
    deleted: set[int] = dataclasses.field(default_factory=set)

    @classmethod
    def read(cls, path: Path) -> "Ledger":
        ledger = cls(path)
        if path.is_file():
            for line in path.read_text().splitlines():
                state, _, number = line.partition(" ")
                if number.isdigit() and state in ("written", "complete", "deleted"):
                    getattr(ledger, state).add(int(number))
        return ledger

    def note(self, state: str, iteration: int) -> None:
        """Record ``state`` for ``iteration`` (once), appended at once to the file."""
        if iteration in getattr(self, state):
            return
        getattr(self, state).add(iteration)
        with self.path.open("a") as out:
            out.write(f"{state} {iteration}\n")

    @property
    def present(self) -> set[int]:
        """Written by the run and not yet deleted."""
        return self.written - self.deleted


def kept(complete: set[int], tracker: int, keep_last: int, keep_every: int | None) -> set[int]:
    """The checkpoints retention keeps: the newest ``keep_last`` complete ones, each complete
    one at a multiple of ``keep_every``, and the one the tracker names."""
    newest = sorted(complete, reverse=True)[:keep_last]
    every = {it for it in complete if keep_every and it % keep_every == 0}
    return {*newest, *every, tracker}


@dataclasses.dataclass
class Retention:
    """One allocation's retention of the checkpoints in ``ckpt_dir``."""

    ckpt_dir: Path
    ledger: Ledger
    keep_last: int
    keep_every: int | None = None
    start: int = 0  # the tracker's iteration when the allocation began
    before: set[int] = dataclasses.field(default_factory=set)  # folders there at its start

    @classmethod
    def begin(cls, ckpt_dir: Path, ledger_path: Path, keep_last: int,
              keep_every: int | None = None) -> "Retention":
        if keep_last < 1:
            raise ValueError(f"keep_last {keep_last}: keep at least the newest checkpoint")
        return cls(ckpt_dir, Ledger.read(ledger_path), keep_last, keep_every,
                   tracker_iteration(ckpt_dir) or 0, checkpoint_iterations(ckpt_dir))

    def observe(self) -> int | None:
        """Note what appeared and what is complete; the tracker's iteration."""
        tracker = tracker_iteration(self.ckpt_dir)
        appeared = {it for it in checkpoint_iterations(self.ckpt_dir) - self.before
                    if it > self.start}
        for it in sorted(appeared):
            self.ledger.note("written", it)
        if tracker is None:
            return None
        if tracker in self.ledger.present:
            self.ledger.note("complete", tracker)
        for it in sorted(appeared):
            if it <= tracker:
                self.ledger.note("complete", it)
        return tracker

    def prune(self) -> list[int]:
        """Observe, then delete what is not kept; the iterations deleted."""
        tracker = self.observe()
        if tracker is None:
            return []
        keep = kept(self.ledger.complete & self.ledger.present, tracker, self.keep_last,
                    self.keep_every)
        doomed = sorted(it for it in self.ledger.present if it < tracker and it not in keep)
        for it in doomed:
            self._delete(it)
        return doomed

    def _delete(self, iteration: int) -> None:
        name = f"iter_{iteration:07d}"
        folder, aside = self.ckpt_dir / name, self.ckpt_dir / f"{DELETING}{name}"
        if folder.exists():
            os.replace(folder, aside)  # out of Megatron's naming in one step
        shutil.rmtree(aside, ignore_errors=True)
        self.ledger.note("deleted", iteration)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(retention: Retention, while_pid: int, poll_s: float) -> None:
    """Prune every ``poll_s`` seconds while process ``while_pid`` (the training) runs, then
    once more. SLURM's signals to the job do not stop it: the save they ask for comes
    after them, and is this allocation's to note."""
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while _pid_alive(while_pid):
        _report(retention.prune())
        time.sleep(poll_s)
    _report(retention.prune())


def _report(deleted: list[int]) -> None:
    if deleted:
        print(f"retention: deleted checkpoint(s) of iteration {', '.join(map(str, deleted))}",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m megatron_burst.launch.slurm.checkpoint_retention",
        description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt-dir", required=True, type=Path, help="Megatron's --save folder")
    parser.add_argument("--ledger", required=True, type=Path, help="the run's ledger file")
    parser.add_argument("--keep-last", required=True, type=int)
    parser.add_argument("--keep-every", type=int, default=None)
    parser.add_argument("--while-pid", type=int, help="prune while this process runs")
    parser.add_argument("--poll-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        retention = Retention.begin(args.ckpt_dir, args.ledger, args.keep_last, args.keep_every)
    except ValueError as e:
        print(f"error: retention: {e}", file=sys.stderr)
        return 2
    if args.while_pid is None:
        _report(retention.prune())
    else:
        watch(retention, args.while_pid, args.poll_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
