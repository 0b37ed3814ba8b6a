"""The rank pool of ``tests/distributed.py``: reused, isolated, and loud when a job fails.

Every job must see new rank processes (nothing a job changes reaches the next), a failing
or hanging job must fail its test in bounded time with every rank's traceback or stack, and
the pool must serve the next job afterwards.
"""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests import distributed
from tests.distributed import run_ranks

import megatron_burst.comm as comm

_MARK = "BURST_TEST_POOL_MARK"


def _report(rank: int, world: int, value: int) -> dict:
    total = torch.tensor([rank + value])
    dist.all_reduce(total)
    return {"rank": rank, "world": world, "sum": int(total), "pid": os.getpid(),
            "server": os.getppid()}


def _leave_state(rank: int, world: int) -> dict:
    """What a previous job could have left behind, then leaves all of it behind itself."""
    seen = {"env": os.environ.get(_MARK), "patched": hasattr(comm, "_pool_mark"),
            "dtype": str(torch.get_default_dtype()), "threads": torch.get_num_threads(),
            "grad": torch.is_grad_enabled(), "random": float(torch.rand(()))}
    os.environ[_MARK] = "left"
    comm._pool_mark = True
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(2)
    torch.set_grad_enabled(False)
    return seen


def test_ranks_return_by_rank_and_are_new_processes_each_job() -> None:
    first = run_ranks(3, _report, 10)
    assert [r["rank"] for r in first] == [0, 1, 2]
    assert {r["world"] for r in first} == {3} and {r["sum"] for r in first} == {33}
    second = run_ranks(2, _report, 1)
    assert [r["sum"] for r in second] == [3, 3]
    assert not {r["pid"] for r in first} & {r["pid"] for r in second}
    # One server forked them all (the pool is reused, across world sizes).
    assert len({r["server"] for r in first + second}) == 1


def test_nothing_a_job_changes_reaches_the_next() -> None:
    before = run_ranks(2, _leave_state)
    after = run_ranks(2, _leave_state)
    assert after == before
    assert before[0] == {"env": None, "patched": False, "dtype": "torch.float32",
                         "threads": 1, "grad": True, "random": before[0]["random"]}


def test_the_callers_environment_reaches_the_ranks(monkeypatch) -> None:
    monkeypatch.setenv(_MARK, "from the test")
    assert [r["env"] for r in run_ranks(2, _leave_state)] == ["from the test"] * 2


def _raise_or_wait(rank: int, world: int) -> None:
    if rank == 1:
        raise RuntimeError("rank 1 gives up")
    while True:  # waits for word from rank 1 that never comes
        time.sleep(0.1)


def test_a_raising_rank_fails_with_its_traceback_and_stops_its_peers(monkeypatch) -> None:
    monkeypatch.setattr(distributed, "GRACE_S", 1.0)
    start = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        run_ranks(2, _raise_or_wait, timeout=120)
    assert time.monotonic() - start < 30
    said = str(failed.value)
    assert "rank 1 failed; ranks [0] were stopped" in said, said
    assert "RuntimeError: rank 1 gives up" in said, said
    assert "rank 0: still running; its stack:" in said and "_raise_or_wait" in said, said
    assert [r["sum"] for r in run_ranks(2, _report, 0)] == [1, 1]  # the pool still serves


def _hang(rank: int, world: int) -> None:
    print(f"rank {rank} is about to hang", flush=True)
    while True:
        time.sleep(0.1)


def test_a_hang_fails_within_the_timeout_with_every_ranks_stack(capsys) -> None:
    run_ranks(2, _report, 0)  # the server is up: the 3 s below are the ranks' alone
    start = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        run_ranks(2, _hang, timeout=3)
    assert time.monotonic() - start < 30
    said = str(failed.value)
    assert said.startswith("timed out after 3s (a hang?); finished ranks: []"), said
    for rank in (0, 1):
        assert f"rank {rank}: still running; its stack:" in said
    assert said.count("in _hang") == 2, said
    assert "rank 1 is about to hang" in capsys.readouterr().out  # what ranks print is kept
    assert [r["sum"] for r in run_ranks(2, _report, 0)] == [1, 1]


def _die(rank: int, world: int) -> None:
    if rank == 0:
        os._exit(3)


def test_a_rank_that_dies_is_named_with_its_exit_code() -> None:
    with pytest.raises(AssertionError, match="rank 0: died with exit code 3"):
        run_ranks(2, _die, timeout=60, barrier=False)
    assert [r["sum"] for r in run_ranks(2, _report, 0)] == [1, 1]


def test_a_lost_server_is_replaced() -> None:
    server = run_ranks(2, _report, 0)[0]["server"]
    os.kill(server, 9)
    time.sleep(0.2)
    again = run_ranks(2, _report, 0)
    assert again[0]["server"] != server and [r["sum"] for r in again] == [1, 1]


def _count(rank: int, world: int, sem) -> int:
    sem.release()
    return rank


def test_fresh_spawns_for_arguments_only_inheritance_passes() -> None:
    sem = mp.get_context("spawn").Semaphore(0)
    with pytest.raises(TypeError, match="pass fresh=True"):
        run_ranks(2, _count, sem)
    assert run_ranks(2, _count, sem, fresh=True, timeout=300) == [0, 1]
    assert sem.acquire(timeout=1) and sem.acquire(timeout=1)


def test_a_job_the_server_cannot_load_is_refused_and_the_pool_serves_on(tmp_path,
                                                                        monkeypatch) -> None:
    import importlib.util
    import sys

    (tmp_path / "elsewhere.py").write_text("def job(rank, world):\n    return rank\n")
    spec = importlib.util.spec_from_file_location("burst_pool_elsewhere",
                                                  tmp_path / "elsewhere.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "burst_pool_elsewhere", module)  # not on any path
    with pytest.raises(AssertionError, match="(?s)could not load the job.*burst_pool_elsewhere"):
        run_ranks(2, module.job, timeout=60)
    assert [r["sum"] for r in run_ranks(2, _report, 0)] == [1, 1]


def _unpicklable(rank: int, world: int):
    return lambda: rank


def test_a_result_that_cannot_be_pickled_is_an_error_naming_the_rank() -> None:
    with pytest.raises(AssertionError, match="rank 0:\nthe rank's result cannot be pickled"):
        run_ranks(2, _unpicklable, timeout=60)
