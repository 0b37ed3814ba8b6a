"""Every field of the one schema (``options.BurstOptions``) has its place at each way in.

The ``--burst-*`` flags are made from the schema's fields (``tests/megatron/
test_burst_options.py`` walks them); here: a config sets each field at exactly one key,
with the schema's default and choices (the ``burst:`` section is made from the fields);
``burst_attn`` and the spec provider take each field as a keyword, or it reaches them
another way, named in the tables below, so a field added to the schema fails here until it
is placed.
"""
from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest

from megatron_burst import burst_attn
from megatron_burst.launch.config import schema
from megatron_burst.launch.config.owned_flags import owner_of
from megatron_burst.decide.options import OPTION_FIELDS, TOPOLOGY_OPTIONS, NotGiven

FIELDS = {f.name: f for f in OPTION_FIELDS}

# Each field, as burst_attn takes it: a keyword of its own, or where the call finds it.
BURST_ATTN = {
    "backward": "backward",
    "ulysses_size": "ulysses_size",
    "intra_node_size": "intra_node_size",
    "profile": None,  # read by 'auto' from $MEGATRON_BURST_PROFILE (options.resolve)
    "remat_aware": "keep",  # the layer's AttentionKeep, which the spec's remat_aware makes
    "document_mask": "cu_seqlens",  # a DocumentPack or the documents' boundaries
    "document_layout": "layout",
    "document_capacity": "cu_seqlens",  # the boundaries, padded to it
}
# Each field, as the spec functions take it: a keyword, or how a run's layers get it.
SPEC = {
    "backward": "backward",
    "ulysses_size": "ulysses_size",
    "intra_node_size": "intra_node_size",
    "profile": "profile",
    "remat_aware": "remat_aware",
    "document_mask": None,  # each micro-batch's DocumentParams (packed_seq_params)
    "document_layout": None,  # likewise: the layout the DocumentParams name
    "document_capacity": None,  # likewise: their boundaries, padded to it
}


def _config_field(key: str) -> dataclasses.Field:
    section, name = key.split(".")
    cls = typing.get_type_hints(schema.Config)[section]
    return {f.name: f for f in dataclasses.fields(cls)}[name]


def test_a_config_sets_each_field_at_one_key_with_the_schemas_default():
    assert set(schema.OPTION_KEYS) == set(FIELDS)
    assert len(set(schema.OPTION_KEYS.values())) == len(FIELDS)
    for name, key in schema.OPTION_KEYS.items():
        assert _config_field(key).default == FIELDS[name].metadata["default"], key
    burst_section = {f.name for f in dataclasses.fields(schema.BurstConfig)}
    assert burst_section == set(schema.BURST_KEYS) == {
        name for name, key in schema.OPTION_KEYS.items() if key.startswith("burst.")}


def test_a_configs_choices_are_the_schemas():
    for name, field in FIELDS.items():
        if field.metadata["choices"]:
            assert schema.CHOICES[schema.OPTION_KEYS[name]] == tuple(field.metadata["choices"])


def test_each_flag_is_owned_by_its_fields_config_key():
    for name, key in schema.OPTION_KEYS.items():
        assert owner_of("--burst-" + name.replace("_", "-")) == key, name


def test_burst_attn_places_every_field():
    assert set(BURST_ATTN) == set(FIELDS)
    params = inspect.signature(burst_attn).parameters
    for name, keyword in BURST_ATTN.items():
        assert keyword is None or keyword in params, (name, keyword)
    for name in ("backward", "ulysses_size", "intra_node_size"):  # told from a value given
        assert params[name].default == NotGiven(FIELDS[name].metadata["default"]), name


def test_the_spec_places_every_field():
    pytest.importorskip("megatron.core")
    from megatron_burst.megatron.spec import BurstSpecProvider, get_gpt_layer_burst_spec

    assert set(SPEC) == set(FIELDS)
    explicit = inspect.signature(get_gpt_layer_burst_spec).parameters
    for name, keyword in SPEC.items():
        assert keyword is None or keyword in explicit or keyword in TOPOLOGY_OPTIONS, name
    for name in ("document_mask", "document_layout", "document_capacity"):
        with pytest.raises(ValueError, match="unknown option"):
            BurstSpecProvider(use_te=False, **{name: True})
    assert BurstSpecProvider(use_te=False, backward="ring").params["burst_options"] == {
        "backward": "ring"}
