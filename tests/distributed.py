"""Run a function on every rank of a small gloo process group on this machine.

Starting a rank costs seconds (a new Python imports torch, and megatron-core for the Megatron
tests) while a small case costs milliseconds, so the ranks do not start from nothing each
time. One *rank server* per backend is spawned on first use and kept for the session: a
process that has imported torch and, as jobs arrive, the test modules their functions live
in. For each ``run_ranks`` call it forks ``world`` rank processes, which join a new group
(a new file store), run the function, pass the closing barrier, report and exit. Each rank
is therefore a fresh process as far as the test can tell: nothing a job changes (the
environment, monkeypatched modules, megatron-core's parallel state, the package's caches,
torch's global settings, a group broken on purpose) reaches the next job, because it
changed only processes that are gone. The server itself runs no test code beyond importing
the function's module.

Failures are bounded and loud. A rank that raises fails the test with its traceback; its
peers get ``GRACE_S`` seconds to finish, then every rank still running has its Python stack
dumped (faulthandler) into the error and is killed. A group that does not finish within
``timeout`` seconds (a hang) fails the same way. A server that dies or stops answering is
killed and a new one is spawned for the next job. Servers and ranks are killed when the
interpreter exits, and a rank dies with its server (and the server with this process).

``fresh=True`` spawns new processes instead (as ``backend="nccl"`` always does): for
arguments that cannot be pickled to the server, such as a multiprocessing semaphore.
"""
from __future__ import annotations

import atexit
import faulthandler
import gc
import multiprocessing.connection as mp_connection
import os
import pickle
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# After one rank failed, how long its peers get to finish before they are stopped.
GRACE_S = 10.0
# How long a rank gets to dump its stack, and a server to answer after its ranks were killed.
_DUMP_S, _ANSWER_S = 2.0, 10.0


# ---------------------------------------------------------------- in a rank process


def _die_with_parent(parent: int) -> None:
    """Get SIGKILL when the parent process dies (Linux), so no rank outlives its server."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001  (best effort off Linux)
        pass
    if os.getppid() != parent:  # it died before the request
        os._exit(1)


def _redirect_output(prefix: str) -> None:
    """Send this process's stdout and stderr to ``prefix.out`` and ``prefix.err``."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, end in ((1, ".out"), (2, ".err")):
        target = os.open(prefix + end, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)


def _rank_main(rank: int, world: int, folder: str, backend: str, fn, args, barrier: bool,
               seed: int | None) -> None:
    """Run one rank's job and exit: code 0 and ``rank<r>.result`` holding ("ok", value), or
    code 1 and ("error", traceback). Never returns."""
    code = 2
    try:
        prefix = os.path.join(folder, f"rank{rank}")
        _redirect_output(prefix)
        stack = open(prefix + ".stack", "w")  # noqa: SIM115  (open until the process ends)
        faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
        if seed is not None:  # the random state of a new process, whatever ran before
            torch.manual_seed(seed)
            random.seed()
            if "numpy" in sys.modules:
                sys.modules["numpy"].random.seed()
        try:
            torch.set_num_threads(1)
            if backend == "nccl":
                torch.cuda.set_device(rank)
            # A file store: no port to pick, so no other process can take it first.
            dist.init_process_group(backend, init_method=f"file://{folder}/store", rank=rank,
                                    world_size=world)
            out = fn(rank, world, *args)
            if barrier:
                dist.barrier()
            result = ("ok", out)
        except BaseException:  # report everything, including assertion errors
            result = ("error", traceback.format_exc())
        try:
            data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:  # noqa: BLE001
            result = ("error", "the rank's result cannot be pickled:\n" + traceback.format_exc())
            data = pickle.dumps(result)
        with open(prefix + ".tmp", "wb") as f:
            f.write(data)
        os.replace(prefix + ".tmp", prefix + ".result")
        code = 0 if result[0] == "ok" else 1
        # NCCL: no destroy. A communicator that CUDA graphs captured can block its destroy
        # for good (seen on 2x H200, torch 2.11); the process exits at once below anyway.
        if dist.is_initialized() and backend != "nccl":
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _spawned_rank(parent, rank, world, folder, backend, fn, args, barrier) -> None:
    """Target of a ``fresh`` spawned rank."""
    _die_with_parent(parent)
    _rank_main(rank, world, folder, backend, fn, args, barrier, seed=None)


# ---------------------------------------------------------------- in the rank server


def _serve(conn, parent: int) -> None:
    """The rank server's loop: for each job, fork its ranks and report their pids and exits."""
    _die_with_parent(parent)
    torch.set_num_threads(1)
    seed = torch.initial_seed()  # what a new process starts from
    # Ranks are forked from here: a collection in a rank must not walk (and so copy, page
    # by page) the server's whole heap, so the server's objects are frozen before each fork
    # and only the ranks collect (Python's advice for fork without exec).
    gc.disable()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    while True:
        try:
            folder, cwd, path, env, job = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the parent is gone or closed us
            return
        try:
            _redirect_output(os.path.join(folder, "server"))
            # The caller's view of the world, before the job's modules are imported.
            os.environ.clear()
            os.environ.update(env)
            sys.path[:] = path
            os.chdir(cwd)
            world, backend, fn, args, barrier = pickle.loads(job)  # imports fn's module
        except BaseException:  # noqa: BLE001
            conn.send(("refused", traceback.format_exc()))
            continue
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        ranks = {}
        me = os.getpid()
        gc.collect()
        gc.freeze()
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                gc.enable()
                conn.close()
                _die_with_parent(me)
                _rank_main(rank, world, folder, backend, fn, args, barrier, seed)
            ranks[pid] = rank
        conn.send(("pids", {rank: pid for pid, rank in ranks.items()}))
        while ranks:
            pid, status = os.waitpid(-1, 0)
            if pid in ranks:
                conn.send(("exit", ranks.pop(pid), os.waitstatus_to_exitcode(status)))
        conn.send(("done",))


# ---------------------------------------------------------------- in the test process


class _Server:
    """The parent's handle on one rank server (spawned on first use, respawned if lost)."""

    def __init__(self) -> None:
        self.proc = None
        self.conn = None

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(theirs, os.getpid()), daemon=True,
                                name="burst-rank-server")
        self.proc.start()
        theirs.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def stop(self) -> None:
        """Kill the server (its ranks die with it) and forget it."""
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(timeout=5)
            self.conn.close()
        self.proc = self.conn = None


_SERVERS: dict[str, _Server] = {}


@atexit.register
def _stop_servers() -> None:
    for server in _SERVERS.values():
        server.stop()


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _PooledJob:
    """A job on the rank server: pids and exits arrive as messages from the server."""

    def __init__(self, server: _Server, world: int, folder: str, job: bytes) -> None:
        self.server, self.pids, self.exits = server, {}, {}
        self.lost = self.refused = None  # why the server cannot be trusted / took no job
        self.done = False
        server.conn.send_bytes(pickle.dumps((folder, os.getcwd(), list(sys.path),
                                             dict(os.environ), job)))

    def next_exit(self, deadline: float):
        """(rank, exit code) of the next rank that ended, or None at ``deadline`` or when
        the server refused the job, finished or died."""
        conn = self.server.conn
        try:
            while not self.done and self.refused is None and conn.poll(
                    max(deadline - time.monotonic(), 0)):
                kind, *body = conn.recv()
                if kind == "pids":
                    self.pids = body[0]
                elif kind == "exit":
                    self.exits[body[0]] = body[1]
                    return body[0], body[1]
                elif kind == "refused":
                    self.refused = body[0]
                elif kind == "done":
                    self.done = True
        except (EOFError, OSError) as e:
            self.lost = f"the rank server died ({e!r})"
        return None

    def running(self) -> dict:
        return {r: pid for r, pid in self.pids.items() if r not in self.exits}

    def finish(self) -> None:
        """Wait for the server's last word on this job; kill the server unless it is clean
        (then the next job spawns a new one)."""
        if self.refused is not None:
            return
        deadline = time.monotonic() + _ANSWER_S
        while not self.done and self.lost is None and time.monotonic() < deadline:
            self.next_exit(deadline)
        if not self.done and self.lost is None:
            self.lost = "the rank server did not answer"
        if self.lost is not None:
            for pid in self.pids.values():
                _kill(pid, signal.SIGKILL)
            self.server.stop()


class _SpawnedJob:
    """A job on newly spawned processes (``fresh=True``, and every nccl job)."""

    def __init__(self, world: int, folder: str, backend: str, fn, args, barrier: bool) -> None:
        ctx = mp.get_context("spawn")
        self.procs = [ctx.Process(target=_spawned_rank, args=(os.getpid(), r, world, folder,
                                                              backend, fn, args, barrier),
                                  daemon=True)
                      for r in range(world)]
        for p in self.procs:
            p.start()
        self.pids = {r: p.pid for r, p in enumerate(self.procs)}
        self.exits, self.lost, self.refused = {}, None, None

    def next_exit(self, deadline: float):
        while True:
            for r, p in enumerate(self.procs):
                if r not in self.exits and p.exitcode is not None:
                    self.exits[r] = p.exitcode
                    return r, p.exitcode
            live = [p.sentinel for r, p in enumerate(self.procs) if r not in self.exits]
            left = deadline - time.monotonic()
            if not live or left <= 0 or not mp_connection.wait(live, timeout=left):
                return None

    def running(self) -> dict:
        return {r: pid for r, pid in self.pids.items() if r not in self.exits}

    def finish(self) -> None:
        for p in self.procs:
            p.join(timeout=_ANSWER_S)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def run_ranks(world: int, fn, *args, timeout: float = 600.0, backend: str = "gloo",
              barrier: bool = True, fresh: bool = False) -> list:
    """Run ``fn(rank, world, *args)`` on ``world`` ranks; return the results by rank.

    ``backend="nccl"`` gives rank r GPU r (on newly spawned processes). ``barrier=False``
    skips the closing barrier, for tests that break the group on purpose (a timed-out gloo
    wait closes its connections). ``fresh=True`` spawns new processes instead of forking
    them from the rank server: for arguments only inheritance can pass (semaphores).
    What the ranks print is written to this process's stdout and stderr once they end.
    """
    folder = tempfile.mkdtemp(prefix="burst-ranks-")
    job = None
    try:
        if fresh or backend != "gloo":
            job = _SpawnedJob(world, folder, backend, fn, args, barrier)
        else:
            try:
                payload = pickle.dumps((world, backend, fn, args, barrier),
                                       protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:
                raise TypeError(f"run_ranks: the arguments of {fn.__name__} cannot be "
                                f"pickled to the rank server ({e}); pass fresh=True") from e
            server = _SERVERS.setdefault(backend, _Server())
            if not server.alive():
                server.stop()
                server.start()
            job = _PooledJob(server, world, folder, payload)
        return _collect(job, world, folder, timeout)
    finally:
        if job is not None:
            for pid in job.running().values():  # interrupted (^C): nothing may linger
                _kill(pid, signal.SIGKILL)
            job.finish()
        _relay_output(folder, world)
        shutil.rmtree(folder, ignore_errors=True)


def _collect(job, world: int, folder: str, timeout: float) -> list:
    """Wait for the ranks (stopping them at the deadline), then their results or errors."""
    deadline, first_failed = time.monotonic() + timeout, None
    while len(job.exits) < world:
        ended = job.next_exit(deadline)
        if ended is None:
            break  # the deadline, or the server refused the job or died
        rank, code = ended
        if code != 0 and first_failed is None:
            first_failed = rank
            deadline = min(deadline, time.monotonic() + GRACE_S)
    if job.refused is not None:
        raise AssertionError(f"the rank server could not load the job:\n{job.refused}")
    stuck = job.running()
    if stuck:  # a hang, or peers stuck behind a failed rank: their stacks, then kill them
        for pid in stuck.values():
            _kill(pid, signal.SIGUSR1)
        until = time.monotonic() + _DUMP_S
        while time.monotonic() < until and not all(
                _read(os.path.join(folder, f"rank{r}.stack")) for r in stuck):
            time.sleep(0.05)
        for pid in stuck.values():
            _kill(pid, signal.SIGKILL)
    got, errors = {}, []
    if len(job.exits) < world and first_failed is None and job.lost is None:
        errors.append(f"timed out after {timeout}s (a hang?); finished ranks: "
                      f"{sorted(job.exits)}")
    elif first_failed is not None and stuck:
        errors.append(f"rank {first_failed} failed; ranks {sorted(stuck)} were stopped "
                      f"{GRACE_S:.0f}s later")
    if job.lost is not None:
        errors.append(job.lost)
    for rank in range(world):
        result = os.path.join(folder, f"rank{rank}.result")
        if os.path.exists(result):
            with open(result, "rb") as f:
                status, payload = pickle.load(f)
            if status == "ok":
                got[rank] = payload
            else:
                errors.append(f"rank {rank}:\n{payload}")
        elif rank in stuck:
            errors.append(f"rank {rank}: still running; its stack:\n"
                          f"{_read(os.path.join(folder, f'rank{rank}.stack')) or '(none)'}")
        elif rank in job.exits:
            errors.append(f"rank {rank}: died with exit code {job.exits[rank]} and no "
                          f"result; the end of its stderr:\n"
                          f"{_read(os.path.join(folder, f'rank{rank}.err'))[-4000:]}")
        else:
            errors.append(f"rank {rank}: not started")
    if errors:
        raise AssertionError("\n".join(errors))
    return [got[r] for r in range(world)]


def _relay_output(folder: str, world: int) -> None:
    """What the server and the ranks printed, to this process's (captured) output."""
    for name in ["server", *(f"rank{r}" for r in range(world))]:
        for end, stream, what in ((".out", sys.stdout, "stdout"), (".err", sys.stderr, "stderr")):
            text = _read(os.path.join(folder, name + end))
            if text:
                stream.write(f"--- {name} {what} ---\n{text}")
