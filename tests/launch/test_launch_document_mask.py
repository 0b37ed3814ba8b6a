"""`data.document_mask` end to end on the command line: config key -> --burst-document-mask
-> the adapter's parser -> the document layout the run uses, and what is refused."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from megatron_burst.launch.config.schema import ConfigError, load_config
from megatron_burst.launch.run.flags import megatron_flags

from .conftest import REPO

arguments = pytest.importorskip("megatron_burst.megatron.arguments")


def _one_sequence(tiny_raw: dict, **data) -> dict:
    """The tiny config with one sequence per micro batch and `data` changed."""
    tiny_raw["data"].update(data)
    tiny_raw["training"]["micro_batch_size"] = 1
    tiny_raw["training"]["global_batch_size"] = 1
    return tiny_raw


def _config(tiny_raw, write_config, **data):
    return load_config(write_config(_one_sequence(tiny_raw, **data)))


def _args(argv: list[str], **megatron) -> argparse.Namespace:
    """--burst-* parsed by add_burst_args, plus the Megatron values the check reads."""
    args, _ = arguments.add_burst_args(argparse.ArgumentParser()).parse_known_args(argv)
    values = dict(cp_comm_type="burst", micro_batch_size=1, pipeline_model_parallel_size=1,
                  sequence_parallel=False, reset_attention_mask=False,
                  reset_position_ids=False, position_embedding_type="rope")
    values.update(megatron)
    for key, value in values.items():
        setattr(args, key, value)
    return args


def test_the_config_key_becomes_the_flag_and_the_flag_a_layout(tiny_raw, write_config):
    flags = megatron_flags(_config(tiny_raw, write_config, document_mask=True))
    assert flags.count("--burst-document-mask") == 1
    assert arguments.document_layout_from_args(_args(flags)) == "whole_docs"
    plain = megatron_flags(_config(tiny_raw, write_config, document_mask=False))
    assert "--burst-document-mask" not in plain
    assert arguments.document_layout_from_args(_args(plain)) is None


def test_the_layout_key_becomes_the_layout_flag(tiny_raw, write_config):
    with pytest.raises(ConfigError, match="'data.document_layout' zigzag needs .* no sequence "
                                          "parallelism"):  # the tiny config's TP=2 with SP
        megatron_flags(_config(tiny_raw, write_config, document_mask=True,
                               document_layout="zigzag"))
    tiny_raw["parallel"]["sequence_parallel"] = False
    cfg = _config(tiny_raw, write_config, document_mask=True, document_layout="zigzag")
    assert arguments.document_layout_from_args(_args(megatron_flags(cfg))) == "zigzag"
    with pytest.raises(ConfigError, match="'data.document_layout' shards document masks: it "
                                          "needs 'data.document_mask'"):
        megatron_flags(_config(tiny_raw, write_config, document_mask=False,
                               document_layout="zigzag"))
    with pytest.raises(ConfigError, match="data.document_layout"):
        _config(tiny_raw, write_config, document_layout="diagonal")
    tiny_raw["megatron_args"] = ["--burst-document-layout", "zigzag"]
    with pytest.raises(ConfigError, match="data.document_layout"):
        _config(tiny_raw, write_config, document_mask=True)


def test_document_mask_with_more_than_one_sequence_per_micro_batch_fails(tiny_raw,
                                                                         write_config):
    tiny_raw["data"]["document_mask"] = True  # the tiny config has micro_batch_size 2
    with pytest.raises(ConfigError, match="needs micro batch size 1, got 2 "
                                          r"\('training.micro_batch_size'\)"):
        megatron_flags(load_config(write_config(tiny_raw)))


def test_the_layout_flag_parses():
    args = _args(["--burst-document-mask", "--burst-document-layout", "zigzag"])
    assert arguments.document_layout_from_args(args) == "zigzag"
    with pytest.raises(SystemExit):
        _args(["--burst-document-layout", "diagonal"])


@pytest.mark.parametrize("argv, megatron, match", [
    (["--burst-document-mask"], dict(micro_batch_size=2), "--micro-batch-size 1"),
    (["--burst-document-mask"], dict(cp_comm_type="a2a"), "needs BurstAttention"),
    (["--burst-document-mask", "--burst-document-layout", "zigzag"],
     dict(pipeline_model_parallel_size=2), "zigzag needs"),
    (["--burst-document-mask", "--burst-document-layout", "zigzag"],
     dict(sequence_parallel=True), "zigzag needs"),
    (["--burst-document-layout", "zigzag"], {}, "needs --burst-document-mask"),
    ([], dict(reset_attention_mask=True), "--reset-attention-mask"),
    ([], dict(reset_position_ids=True), "--reset-position-ids"),
])
def test_what_the_document_path_cannot_honour_is_refused(argv, megatron, match):
    with pytest.raises(ValueError, match=match):
        arguments.document_layout_from_args(_args(argv, **megatron))


def test_reset_flags_that_do_something_are_accepted():
    # Learned absolute positions read position_ids, so the dataset's reset ones are used.
    assert arguments.document_layout_from_args(
        _args([], reset_position_ids=True, position_embedding_type="learned_absolute")) is None
    # With document masks the --reset-* flags only repeat what the documents do.
    args = _args(["--burst-document-mask"], reset_attention_mask=True, reset_position_ids=True)
    assert arguments.document_layout_from_args(args) == "whole_docs"


@pytest.mark.skipif(not os.environ.get("MEGATRON_TRAINING_PATH"),
                    reason="set MEGATRON_TRAINING_PATH to an unpacked megatron-core >= 0.17 "
                           "wheel (.ci/run does) to parse with it in a subprocess")
def test_newer_megatron_parser_accepts_the_document_flag(tiny_raw, write_config):
    path = write_config(_one_sequence(tiny_raw, document_mask=True))
    script = REPO / "tests" / "launch" / "megatron_parse.py"
    proc = subprocess.run([sys.executable, str(script), os.environ["MEGATRON_TRAINING_PATH"],
                           str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("ok ") == 1


def test_the_mask_builder_key_becomes_the_builder_flag(tiny_raw, write_config):
    """data.mask_builder -> --burst-mask-builder, which the adapter's parser reads back; the
    flag in megatron_args is refused naming the key (which exists)."""
    spec = "megatron_burst.megatron.mask_batches:prefix_lm"
    flags = megatron_flags(_config(tiny_raw, write_config, mask_builder=spec))
    assert flags[flags.index("--burst-mask-builder") + 1] == spec
    assert "--burst-document-mask" not in flags
    assert arguments.mask_builder_from_args(_args(flags)) == spec
    raw = _one_sequence(tiny_raw)
    raw["megatron_args"] = ["--burst-mask-builder", spec]
    with pytest.raises(ConfigError, match="set data.mask_builder instead"):
        megatron_flags(load_config(write_config(raw)))


@pytest.mark.parametrize("data, training, match", [
    (dict(mask_builder="no_colon"), {}, "must be module:function"),
    (dict(mask_builder="a.b:c", document_mask=True), {}, "cannot be combined with"),
    (dict(mask_builder="a.b:c"), dict(micro_batch_size=2, global_batch_size=2),
     "micro_batch_size 1"),
])
def test_a_mask_builder_the_run_cannot_take_is_refused_at_plan_time(tiny_raw, write_config,
                                                                    data, training, match):
    raw = _one_sequence(tiny_raw, **data)
    raw["training"].update(training)
    from megatron_burst.launch.planning.plan import validate

    with pytest.raises(ConfigError, match=f"'data.mask_builder': .*{match}"):
        validate(load_config(write_config(raw)))
