"""``tests.patching.swap``: a test that replaces a name the package does not have fails."""
from __future__ import annotations

import pytest

from megatron_burst.attention import ring_rounds

from .patching import swap


def test_swap_refuses_a_name_the_module_does_not_have():
    with pytest.raises(AttributeError, match="_one_partial"):
        swap(ring_rounds, "_one_partial", lambda *args: (False, False))
    assert not hasattr(ring_rounds, "_one_partial")
    real = ring_rounds.one_partial_wire
    assert swap(ring_rounds, "one_partial_wire", None) is real
    assert swap(ring_rounds, "one_partial_wire", real) is None and ring_rounds.one_partial_wire is real
