"""The hosts' own channel (``comm.host_channel``): the gloo twin an NCCL group's agreements
travel on, so the host never waits for the GPU's queue to read what its peers said.

On CPU the groups are gloo already, so the twin is made here of gloo groups directly (the
mechanism is the same: a gloo backend on a prefix of the default store), and
``consensus.gather``'s routing is checked with the group's device said to be CUDA. The GPU
side (an NCCL group's agreement does not wait for a busy GPU) is in ``tests/test_gpu.py``.
"""
from __future__ import annotations

import os

import pytest
import torch

from .distributed import run_ranks
from .patching import swap


def test_the_setting_is_checked_where_it_is_read():
    from megatron_burst.comm import settings

    assert settings.BurstSettings.from_env({}).host_channel == "gloo"
    assert settings.BurstSettings.from_env({settings.HOST_CHANNEL_ENV: " GROUP "}
                                           ).host_channel == "group"
    with pytest.raises(ValueError, match=settings.HOST_CHANNEL_ENV):
        settings.BurstSettings.from_env({settings.HOST_CHANNEL_ENV: "nccl"})


def _over_group(group):
    """The ``agree`` callable ``twin`` takes: a gather over ``group`` itself, on CPU."""
    import torch.distributed as dist

    def agree(values):
        mine = torch.tensor(values, dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, mine, group=group)
        return torch.stack(rows).tolist()
    return agree


def _twins_gather(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from megatron_burst.comm import host_channel

    pair = dist.new_group([0, 1])
    same = dist.new_group([0, 1])  # other group, same ranks: one twin
    made = host_channel.twin(pair, _over_group(pair)) if rank < 2 else None
    out = {}
    if rank < 2:
        again = host_channel.twin(same, _over_group(same))
        work, rows = host_channel.all_gather(made, torch.tensor([rank * 10 + 1, -rank]))
        work.wait()
        out = {"rows": [r.tolist() for r in rows], "shared": again is made,
               "size": made.size()}
    whole = host_channel.twin(None, _over_group(None))
    work, rows = host_channel.all_gather(whole, torch.tensor([rank]))
    work.wait()
    out["world"] = [r.item() for r in rows]
    if rank < 2:
        dist.destroy_process_group(same)
    out["dropped"] = sorted(host_channel._TWINS)
    return out


def test_a_twin_gathers_every_members_values_and_is_shared_by_ranks():
    """Every member gets every member's values in group rank order; two groups of the same
    ranks share one twin; the world has its own; destroying a group drops its ranks' twin."""
    results = run_ranks(3, _twins_gather, timeout=120)
    for rank in (0, 1):
        assert results[rank]["rows"] == [[1, 0], [11, -1]]
        assert results[rank]["shared"] and results[rank]["size"] == 2
        assert results[rank]["dropped"] == [(0, 1, 2)]
    assert all(r["world"] == [0, 1, 2] for r in results)


def _disagreeing_channel(rank: int, world: int) -> str:
    from megatron_burst.comm import host_channel, settings

    os.environ[settings.HOST_CHANNEL_ENV] = "gloo" if rank == 0 else "group"
    settings.reload()
    with pytest.raises(ValueError) as err:
        host_channel.twin(None, _over_group(None))
    return str(err.value)


def test_ranks_with_different_channels_all_raise_the_same_error():
    """A rank on the twin and a rank on the group would each wait for the other: the
    setting is compared first, over the group itself, and every rank raises the same."""
    said = run_ranks(2, _disagreeing_channel, timeout=120)
    assert said[0] == said[1]
    assert "MEGATRON_BURST_HOST_CHANNEL differs" in said[0]
    assert "rank 0: 'gloo', rank 1: 'group'" in said[0]


def _routed(rank: int, world: int, channel: str) -> dict:
    """``consensus.gather`` with the group said to be on CUDA (the exchanges over the group
    itself kept on CPU): over the twin unless the setting says the group."""
    import torch.distributed as dist

    from megatron_burst.comm import consensus, host_channel, settings

    os.environ[settings.HOST_CHANNEL_ENV] = channel
    settings.reload()
    on_group = []
    post = consensus.Exchange._post

    def post_on_cpu(group, values, where):
        on_group.append(list(values))
        return post(group, values, torch.device("cpu"))

    consensus.Exchange._post = staticmethod(post_on_cpu)
    swap(consensus, "device", lambda group: torch.device("cuda", 0))
    tables = [consensus.gather(None, [rank, 7 + i], "for a test") for i in range(2)]
    started = consensus.Exchange(None, [rank, 9], "for a test")  # posted now, read later
    tables.append(started.values())
    held = host_channel._TWINS[(0, 1)]
    dist.destroy_process_group()
    return {"tables": tables, "on_group": on_group, "twin": held is not None,
            "dropped": not host_channel._TWINS}


@pytest.mark.parametrize("channel", ["gloo", "group"])
def test_an_nccl_groups_gather_goes_over_its_twin(channel):
    """With the default setting only the channel's own agreement uses the group; every
    gather after it goes over the twin. With ``group`` they all stay on the group."""
    results = run_ranks(2, _routed, channel, timeout=120, barrier=False)
    code = {"gloo": 1, "group": 2}[channel]
    for rank, r in enumerate(results):
        assert r["tables"] == [[[0, 7 + i], [1, 7 + i]] for i in range(3)]
        assert r["twin"] == (channel == "gloo") and r["dropped"]
        on_group = [] if channel == "gloo" else [[rank, 7 + i] for i in range(3)]
        assert r["on_group"] == [[code], *on_group]


def _without_default_store(rank: int, world: int) -> str:
    import torch.distributed as dist

    from megatron_burst.comm import host_channel

    del dist.distributed_c10d._get_default_store
    with pytest.raises(ValueError) as err:
        host_channel.twin(None, _over_group(None))
    return str(err.value)


def test_a_torch_without_the_default_store_names_the_setting():
    """The twin is made on torch's default store (a private accessor): a torch without it
    gets a ValueError naming the setting that keeps the exchanges on the group."""
    said = run_ranks(2, _without_default_store, timeout=120)
    assert said[0] == said[1] and "MEGATRON_BURST_HOST_CHANNEL=group" in said[0]
