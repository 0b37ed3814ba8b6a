"""The options schema (``megatron_burst.decide.options``): every field is checked when
options are made, with a ValueError naming the field and what it takes; "not given" is told apart from
a value equal to the default; ``resolve`` at one rank and with 'auto'.

Pure functions, no processes. (What the entry points make of an ``OptionError`` is tested
with them: tests/megatron/test_burst_options.py, tests/launch; a few rules are also
exercised through ``burst_attn`` in tests/test_call_safety.py.)
"""
from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from megatron_burst.decide.topology import CPTopology, HeadShape
from megatron_burst.decide.options import (NOT_GIVEN, OPTION_FIELDS, BurstOptions, NotGiven,
                                           OptionError, check_decided, is_given, resolve)
from megatron_burst.decide.timing import PROFILE_ENV, PROFILES_DIR, load_profile, predict

FIELDS = {f.name: f for f in OPTION_FIELDS}
MHA = HeadShape(8, 8, 64, 2)

# field -> (values it takes, what the message says it must be, values it refuses).
# Options that need another one to be valid get it from NEEDS.
TAKES = {
    "backward": (("auto", "burst", "ring"), "must be one of ('auto', 'burst', 'ring')",
                 ("bogus", None, "Ring", 1)),
    "ulysses_size": ((1, 2, 8, "auto"), "must be a positive int or 'auto'",
                     (0, -2, True, 2.0, "2", None, "AUTO")),
    "intra_node_size": ((None, 1, 4, "auto"), "must be a positive int or 'auto' or None",
                        (0, False, 4.0, "x")),
    "profile": ((None, "a100-ib", "/some/where/tuned.json"), "must be a string or None",
                (3, ["a100-ib"])),
    "remat_aware": ((True, False), "must be true or false", (1, "true", None)),
    "document_mask": ((True, False), "must be true or false", (0, "yes", None)),
    "document_layout": ((None, "whole_docs", "zigzag", "pack_zigzag"),
                        "must be one of ('whole_docs', 'zigzag', 'pack_zigzag')",
                        ("stripe", 1)),
    "document_capacity": ((None, 1, 64), "must be a positive int or None",
                          (0, -3, True, 2.0, "64")),
}
NEEDS = {"document_layout": {"document_mask": True},
         "document_capacity": {"document_mask": True, "document_layout": "pack_zigzag"}}


def test_every_field_has_cases() -> None:
    assert set(TAKES) == set(FIELDS)  # a field added later needs its cases here


@pytest.mark.parametrize("field,bad", [
    (field, bad) for field, (_, _, bads) in TAKES.items() for bad in bads])
def test_a_bad_value_is_refused_when_made_naming_the_field(field, bad) -> None:
    with pytest.raises(OptionError) as refused:
        BurstOptions(**NEEDS.get(field, {}), **{field: bad})
    err = refused.value
    assert isinstance(err, ValueError) and err.option == field
    assert str(err) == f"{field} {TAKES[field][1]}, got {bad!r}"


@pytest.mark.parametrize("field,value", [
    (field, value) for field, (goods, _, _) in TAKES.items() for value in goods])
def test_every_value_a_field_takes_is_kept_as_given(field, value) -> None:
    options = BurstOptions(**NEEDS.get(field, {}), **{field: value})
    assert getattr(options, field) == value and field in options.given


# ------------------------------------------------------------ given or not


@pytest.mark.parametrize("field", list(FIELDS))
def test_a_value_equal_to_the_default_is_still_given(field) -> None:
    default = FIELDS[field].metadata["default"]
    given = BurstOptions(**NEEDS.get(field, {}), **{field: default})
    plain = BurstOptions(**NEEDS.get(field, {}))
    assert getattr(given, field) == getattr(plain, field) == default
    assert given.given - plain.given == {field} and given != plain


def test_nothing_given_holds_the_defaults() -> None:
    options = BurstOptions()
    assert options.given == frozenset()
    assert {f: getattr(options, f) for f in FIELDS} == {
        f: FIELDS[f].metadata["default"] for f in FIELDS}
    assert options.fixes() == {} and options.has_auto  # backward defaults to 'auto'


def test_not_given_is_no_value_a_user_can_pass() -> None:
    for value in (None, 0, 1, False, "", "auto"):
        assert is_given(value) and NOT_GIVEN != value
    assert not is_given(NOT_GIVEN) and not is_given(NotGiven(1))
    assert NotGiven(1) == NotGiven(1) != NotGiven(2)
    assert hash(NotGiven("auto")) == hash(NotGiven("auto"))
    assert repr(NotGiven(1)) == "1 (not given)"
    # The schema's fields start out not given, showing the default they stand for.
    assert repr(dataclasses.fields(BurstOptions)[0].default) == "'auto' (not given)"


def test_of_reads_none_as_not_given_and_refuses_unknown_names() -> None:
    assert BurstOptions.of({f: None for f in FIELDS}) == BurstOptions()
    options = BurstOptions.of({"ulysses_size": 1, "backward": None})
    assert options.given == {"ulysses_size"}
    with pytest.raises(OptionError) as refused:
        BurstOptions.of({"ulysess_size": 2, "zz": 1})
    assert refused.value.option == "ulysess_size"  # the first unknown name, sorted
    assert str(refused.value) == ("ulysess_size is not an option; the options are "
                                  + ", ".join(FIELDS))


def test_fixes_are_the_topology_fields_given_by_value() -> None:
    options = BurstOptions(backward="ring", ulysses_size="auto", intra_node_size=4,
                           remat_aware=True)
    assert options.fixes() == {"backward": "ring", "intra_node_size": 4}
    assert options.has_auto
    fixed = BurstOptions(backward="burst", ulysses_size=2, intra_node_size=None)
    assert fixed.fixes() == {"backward": "burst", "ulysses": 2, "intra_node_size": None}
    assert not fixed.has_auto


# ------------------------------------------------------------ rules between fields


@pytest.mark.parametrize("auto", ["backward", "ulysses_size", "intra_node_size"])
def test_a_profile_needs_something_auto_to_read_it(auto) -> None:
    fixed = dict(backward="burst", ulysses_size=1, intra_node_size=None)
    with pytest.raises(OptionError) as refused:
        BurstOptions(**fixed, profile="a100-ib")
    assert refused.value.option == "profile"
    assert str(refused.value) == ("profile is read only by 'auto' choices; backward, "
                                  "intra_node_size and ulysses_size are all fixed here")
    assert BurstOptions(**fixed, profile=None).given >= {"profile"}  # None reads nothing
    assert BurstOptions(**{**fixed, auto: "auto"}, profile="a100-ib").profile == "a100-ib"


def test_a_document_layout_needs_document_masks() -> None:
    with pytest.raises(OptionError) as refused:
        BurstOptions(document_layout="zigzag", document_mask=False)
    assert refused.value.option == "document_layout"
    flag = lambda name: "--burst-" + name.replace("_", "-")  # noqa: E731
    assert refused.value.spelled(flag) == ("--burst-document-layout shards document masks: "
                                           "it needs --burst-document-mask")
    assert BurstOptions(document_layout=None).document_mask is False


RUNS = [  # (options, run settings, the option named or None)
    (dict(document_mask=True), dict(micro_batch_size=2), "document_mask"),
    (dict(document_mask=True), {}, None),
    (dict(document_mask=True, document_layout="zigzag"), dict(pipeline=2), "document_layout"),
    (dict(document_mask=True, document_layout="zigzag"), dict(sequence_parallel=True),
     "document_layout"),
    (dict(document_mask=True, document_layout="whole_docs"),
     dict(pipeline=2, sequence_parallel=True), None),
    (dict(remat_aware=True), {}, "remat_aware"),
    (dict(remat_aware=True), dict(recompute="selective"), "remat_aware"),
    (dict(remat_aware=True), dict(recompute="full"), None),
    ({}, dict(micro_batch_size=4, pipeline=2, sequence_parallel=True), None),
]


@pytest.mark.parametrize("options,run,named", RUNS)
def test_the_rules_that_need_the_run(options, run, named) -> None:
    settings = dict(micro_batch_size=1, pipeline=1, sequence_parallel=False, recompute=None)
    problem = BurstOptions(**options).run_problem(**{**settings, **run})
    assert (problem.option if problem else None) == named
    if problem:
        assert isinstance(problem, OptionError) and str(problem).startswith(named)


# ------------------------------------------------------------ resolve


def test_one_rank_is_one_topology_whatever_is_auto(monkeypatch) -> None:
    monkeypatch.setenv(PROFILE_ENV, "/no/such/profile.json")  # never read at one rank
    one = CPTopology.build(1, heads=MHA)
    for options in (BurstOptions(), BurstOptions(ulysses_size="auto", intra_node_size="auto"),
                    BurstOptions(profile="/no/such/either.json")):
        assert resolve(options, cp=1, heads=MHA, tokens=64, max_intra_node_size=None) == one
    assert resolve(BurstOptions(intra_node_size=1), cp=1, heads=MHA, tokens=64,
                   max_intra_node_size=None) == one  # one rank per node: a flat ring
    kept = resolve(BurstOptions(backward="ring"), cp=1, heads=MHA, tokens=64,
                   max_intra_node_size=None)
    assert kept.backward == "ring"  # a value given is kept, though nothing moves
    with pytest.raises(ValueError, match="ulysses_size"):  # named even at one rank
        resolve(BurstOptions(ulysses_size=2), cp=1, heads=MHA, tokens=64,
                max_intra_node_size=None)


def test_the_profile_is_read_only_by_auto(monkeypatch) -> None:
    monkeypatch.setenv(PROFILE_ENV, "/no/such/profile.json")
    with pytest.raises(ValueError, match="no such file"):
        resolve(BurstOptions(), cp=2, heads=MHA, tokens=64, max_intra_node_size=None)
    fixed = BurstOptions(backward="ring", ulysses_size=1, intra_node_size=None)
    assert resolve(fixed, cp=2, heads=MHA, tokens=64, max_intra_node_size=None).backward == "ring"
    # A profile given beats the environment's.
    assert resolve(BurstOptions(profile="a100-ib"), cp=2, heads=MHA, tokens=64,
                   max_intra_node_size=None).backward in ("burst", "ring")


def test_a_profile_rewritten_on_disk_is_read_again(tmp_path) -> None:
    path = tmp_path / "tuned.json"
    path.write_text((PROFILES_DIR / "h200-nvlink.json").read_text())
    options = BurstOptions(profile=str(path))
    resolve(options, cp=4, heads=MHA, tokens=4096, max_intra_node_size=None)
    path.write_text(json.dumps({"name": "broken"}))
    with pytest.raises(ValueError, match="tuned.json"):
        resolve(options, cp=4, heads=MHA, tokens=4096, max_intra_node_size=None)


@pytest.mark.parametrize("heads,causal", [(MHA, True), (HeadShape(8, 2, 128, 2), True),
                                          (HeadShape(16, 16, 64, 2), False)])
@pytest.mark.parametrize("tokens", [512, 16384])
def test_auto_is_decided_and_no_slower_than_any_fixed_choice(heads, causal, tokens) -> None:
    """Every 'auto' is settled, what was fixed beside it is kept, and the time model
    predicts the choice at least as fast as each topology the options could fix."""
    cp, most = 8, 4
    prof = load_profile("h200-nvlink")

    def seconds(options: BurstOptions) -> float:
        topology = resolve(options, cp=cp, heads=heads, tokens=tokens, causal=causal,
                           max_intra_node_size=most)
        return predict(topology, prof, tokens=tokens, causal=causal,
                       max_intra_node_size=most).total_s

    auto = BurstOptions(ulysses_size="auto", intra_node_size="auto", profile="h200-nvlink")
    chosen = resolve(auto, cp=cp, heads=heads, tokens=tokens, causal=causal,
                     max_intra_node_size=most)
    assert chosen.backward in ("burst", "ring") and cp % chosen.ulysses == 0
    assert chosen.intra_node_size in (None, most)
    for backward, ulysses, ranks in itertools.product(("burst", "ring"), (1, 2, 4),
                                                      (None, most)):
        if heads.hkv % ulysses and ulysses % heads.hkv:
            continue
        fixed = BurstOptions(backward=backward, ulysses_size=ulysses, intra_node_size=ranks)
        assert seconds(auto) <= seconds(fixed) + 1e-6, (chosen.describe(), fixed)
        # One choice fixed, the rest 'auto': the fixed one is kept.
        assert resolve(BurstOptions(backward=backward, ulysses_size="auto",
                                    intra_node_size="auto"), cp=cp, heads=heads,
                       tokens=tokens, causal=causal,
                       max_intra_node_size=most).backward == backward


# ------------------------------------------------------------ a topology decided elsewhere


def test_a_decided_topology_must_fit_the_group_and_the_options_given() -> None:
    topology = CPTopology.build(8, ulysses=2, backward="ring", heads=MHA)  # flat ring of 4
    for options in (BurstOptions(), BurstOptions(backward="auto", ulysses_size="auto"),
                    BurstOptions(backward="ring", ulysses_size=2, intra_node_size=None),
                    # Counts that make a flat ring (one ring position per node, or one
                    # node) fix what the flat topology does.
                    BurstOptions(intra_node_size=2), BurstOptions(intra_node_size=8)):
        assert check_decided(topology, options, cp=8, heads=MHA) is topology
    with pytest.raises(ValueError, match="resolved for cp=8"):
        check_decided(topology, BurstOptions(), cp=4, heads=MHA)
    with pytest.raises(ValueError, match="resolved for cp=8"):
        check_decided(topology, BurstOptions(), cp=8, heads=HeadShape(8, 8, 128, 2))
    # Element size only weighs the time model's choice: a bf16 topology serves fp32.
    assert check_decided(topology, BurstOptions(), cp=8, heads=HeadShape(8, 8, 64, 4))
    for given, fix in ((dict(ulysses_size=1), "{'ulysses': 1}"),
                       (dict(backward="burst"), "{'backward': 'burst'}"),
                       (dict(intra_node_size=4), "{'intra_node_size': 4}")):
        with pytest.raises(ValueError, match="does not do what the options given with it "
                                             "fix: " + fix.replace("{", r"\{")):
            check_decided(topology, BurstOptions(**given), cp=8, heads=MHA)
