"""SLURM time limits: every format `sbatch --time` takes, read as sbatch reads it (slurm's
``time_str2secs`` and ``time_str2mins``: seconds round up, zero means no limit), the ones it
refuses refused, and what `slurm` does with each: bounded by the partition's maximum
(``slurm.max_time``), no limit only where that allows it, and a limit too short saying what
to change (issue 43)."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from megatron_burst.cli.parser import main
from megatron_burst.launch.config.schema import ConfigError, load_config
from megatron_burst.launch.planning.job_plan import job_plan
from megatron_burst.launch.config.slurm_time import (UNLIMITED, format_time_limit,
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


def _with_slurm(cfg, **keys):
    return dataclasses.replace(cfg, slurm=dataclasses.replace(cfg.slurm, **keys))


@pytest.mark.parametrize("text", ["0", "00:00:00", "UNLIMITED"])
def test_no_limit_only_where_the_partition_allows_none(text):
    with pytest.raises(ValueError, match=rf"--time '{text}' asks for no time limit, beyond "
                                         rf"'slurm.max_time' 2-00:00:00.*slurm.max_time: "
                                         rf"UNLIMITED"):
        job_plan(load_config(CONFIG), text)
    plan = job_plan(_with_slurm(load_config(CONFIG), max_time="UNLIMITED"), text)
    assert plan.limit == "UNLIMITED" and plan.exit_after_min is None
    assert plan.allocations == 1


@pytest.mark.parametrize("text, shown", [("30-00:00:00", "30-00:00:00"),
                                         ("2-00:01:00", "2-00:01:00"), ("4000", "2-18:40:00")])
def test_a_limit_beyond_the_partition_maximum_is_refused(text, shown):
    with pytest.raises(ValueError, match=rf"--time '{text}' is {shown}, longer than "
                                         rf"'slurm.max_time' 2-00:00:00 .*give at most "
                                         rf"2-00:00:00"):
        job_plan(load_config(CONFIG), text)
    assert job_plan(load_config(CONFIG), "2-00:00:00").limit == "2-00:00:00"
    wider = _with_slurm(load_config(CONFIG), max_time="7-00:00:00")
    assert job_plan(wider, "4000").limit_min == 4000


@pytest.mark.parametrize("text", ["99999999999999999999", "4294967294", "9999999999-00"])
def test_absurd_limits_are_refused_even_without_a_maximum(text):
    unlimited = _with_slurm(load_config(CONFIG), max_time="UNLIMITED")
    with pytest.raises(ValueError, match=rf"--time '{text}' is [\d,]+ minutes, more than "
                                         rf"SLURM can hold"):
        job_plan(unlimited, text)


def test_the_default_allocation_stays_within_the_partition():
    short = _with_slurm(load_config(CONFIG), max_time="12:00:00")
    assert job_plan(short).limit == "12:00:00"
    assert job_plan(load_config(CONFIG)).limit == "1-00:00:00"


def test_a_step_longer_than_any_allocation_says_what_to_change():
    """Issue 43: plan said `--time None gives 1440 min per allocation` (plan has no --time)."""
    cfg = load_config(REPO / "configs" / "llama2-7b-1m.yaml")
    cfg = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training,
                                                                global_batch_size=1024))
    with pytest.raises(ValueError) as caught:
        job_plan(cfg)
    message = str(caught.value)
    assert "None" not in message and "\n" not in message
    assert message.startswith("the default allocation, 1-00:00:00 (the shortest of 24 hours")
    assert "one step of 7 d" in message and "slurm.max_time 2-00:00:00" in message
    assert "lower training.global_batch_size 1,024 to at most about" in message
    fits = int(message.split("to at most about ")[1].split()[0].replace(",", ""))
    smaller = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training,
                                                                    global_batch_size=fits))
    assert job_plan(smaller, "2-00:00:00").allocations >= 1  # what it names does fit
    with pytest.raises(ValueError, match="--time '1-00:00:00' gives 1440 min per allocation, "
                                         "too short"):
        job_plan(cfg, "1-00:00:00")


def test_the_plan_command_says_it_in_one_line(tmp_path, capsys):
    raw = yaml.safe_load((REPO / "configs" / "llama2-7b-1m.yaml").read_text())
    raw["training"]["global_batch_size"] = 1024
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--time None" not in err
    assert "training.global_batch_size" in err


def test_an_unquoted_clock_time_says_quote_it(tiny_raw, tmp_path):
    text = yaml.safe_dump(tiny_raw) + "slurm:\n  time_limit: 12:00:00\n"
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"'slurm.time_limit' at line \d+: YAML reads the "
                                          r"unquoted 12:00:00 as a base-60 number; quote it: "
                                          r'"12:00:00"'):
        load_config(path)
    path.write_text(text.replace("12:00:00", '"12:00:00"'))
    assert load_config(path).slurm.time_limit == "12:00:00"


def test_the_config_key_is_checked_when_the_config_loads(tiny_raw, write_config):
    tiny_raw["slurm"] = {"time_limit": "30 hours"}
    with pytest.raises(ConfigError, match=r"'slurm.time_limit' '30 hours' is not a SLURM time"):
        load_config(write_config(tiny_raw))
    tiny_raw["slurm"] = {"time_limit": "2-12"}
    assert load_config(write_config(tiny_raw)).slurm.time_limit == "2-12"
