"""SLURM time limits: every format `sbatch --time` takes, read as sbatch reads it (slurm's
``time_str2secs`` and ``time_str2mins``: seconds round up, zero means no limit), the ones it
refuses refused, and what `slurm` does with each."""
from __future__ import annotations

import pytest

from megatron_burst.launch.config import ConfigError, load_config
from megatron_burst.launch.job_plan import job_plan
from megatron_burst.launch.slurm_time import (UNLIMITED, format_time_limit,
                                              parse_time_limit)

from .conftest import REPO

# (what sbatch is given, the limit in minutes it takes; None: no limit)
SBATCH_TIMES = [
    # "minutes"
    ("10", 10),
    ("90", 90),
    ("1440", 1440),
    ("0010", 10),
    # "minutes:seconds": 30:00 is 30 minutes, not 30 hours; seconds round up
    ("30:00", 30),
    ("0:30", 1),
    ("1:01", 2),
    ("90:00", 90),
    ("0:90", 2),  # fields are not range-checked
    # "hours:minutes:seconds"
    ("04:00:00", 240),
    ("1:30:00", 90),
    ("00:00:01", 1),
    ("0:90:00", 90),
    ("48:00:00", 2880),
    # "days-hours": 2-12 is 2 days 12 hours
    ("2-12", 3600),
    ("1-0", 1440),
    ("0-1", 60),
    # "days-hours:minutes"
    ("1-02:30", 1590),
    ("0-0:45", 45),
    # "days-hours:minutes:seconds"
    ("1-00:00:00", 1440),
    ("7-00:00:00", 10080),
    ("0-00:00:30", 1),
    # no limit: the words (any case), -1, and a limit of zero
    ("UNLIMITED", None),
    ("unlimited", None),
    ("INFINITE", None),
    ("Infinite", None),
    ("-1", None),
    ("0", None),
    ("00:00:00", None),
    ("0-0", None),
    ("0:00", None),
]

# What sbatch refuses.
NOT_TIMES = ["", "four hours", "1h", "1:2:3:4", "1-", "-5", "1--2", "1-2-3", "1-:30", ":30",
             "30:", "1-2:", "1.5", " 30", "30 ", "1-2:3:4:5", "+10", "0x10", "unlimit"]


@pytest.mark.parametrize("text, minutes", SBATCH_TIMES, ids=[t for t, _ in SBATCH_TIMES])
def test_sbatch_time_formats(text, minutes):
    assert parse_time_limit(text) == minutes


@pytest.mark.parametrize("text", NOT_TIMES)
def test_what_sbatch_refuses_is_refused(text):
    with pytest.raises(ValueError, match=r"--time .* is not a SLURM time limit"):
        parse_time_limit(text)


@pytest.mark.parametrize("minutes, text", [(1, "00:01:00"), (90, "01:30:00"),
                                           (1440, "1-00:00:00"), (3600, "2-12:00:00"),
                                           (UNLIMITED, "UNLIMITED")])
def test_limits_are_written_as_sbatch_reads_them_back(minutes, text):
    assert format_time_limit(minutes) == text
    assert parse_time_limit(text) == minutes


CONFIG = REPO / "configs" / "llama2-7b-32k.yaml"


@pytest.mark.parametrize("text", ["10", "00:20:00", "0-0:15"])
def test_a_limit_too_short_for_one_step_and_its_save_is_refused(text):
    with pytest.raises(ValueError, match=rf"--time '{text}' gives .* too short for one step "
                                         rf"and its save"):
        job_plan(load_config(CONFIG), text)


@pytest.mark.parametrize("text", ["0", "00:00:00", "UNLIMITED"])
def test_no_limit_runs_the_job_in_one_allocation_without_an_exit(text):
    plan = job_plan(load_config(CONFIG), text)
    assert plan.limit == "UNLIMITED" and plan.exit_after_min is None
    assert plan.allocations == 1


def test_the_config_key_is_checked_when_the_config_loads(tiny_raw, write_config):
    tiny_raw["slurm"] = {"time_limit": "30 hours"}
    with pytest.raises(ConfigError, match=r"'slurm.time_limit' '30 hours' is not a SLURM time"):
        load_config(write_config(tiny_raw))
    tiny_raw["slurm"] = {"time_limit": "2-12"}
    assert load_config(write_config(tiny_raw)).slurm.time_limit == "2-12"
