"""An option nobody set: a value of its own, told apart from every value a user can pass.

Why apart: the options schema (``options``), the call's arguments (``attention.call``) and the
entry points all need to tell "left out" from "given, equal to the default" (an explicit
``ulysses_size=1`` beside a decided topology of Ulysses 2 is a contradiction; leaving it out
is not), and none of them needs the resolver to say so.
"""
from __future__ import annotations

from typing import Any


class NotGiven:
    """The value of an option nobody set, distinct from every value a user can pass (its
    repr shows the default it stands for)."""

    __slots__ = ("default",)

    def __init__(self, default: Any = None):
        self.default = default

    def __repr__(self) -> str:
        return f"{self.default!r} (not given)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NotGiven) and other.default == self.default

    def __hash__(self) -> int:
        return hash((NotGiven, self.default))


NOT_GIVEN: Any = NotGiven()


def is_given(value: Any) -> bool:
    """Whether ``value`` was set by someone (is not a ``NotGiven``)."""
    return not isinstance(value, NotGiven)
