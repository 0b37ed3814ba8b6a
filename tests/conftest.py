"""The suite's settings: 'auto' decides from the shipped profile here, as it did before it
measured machines at first use, so that the hundreds of CPU cases that leave ``backward``
to 'auto' keep deterministic choices and their speed. ``tests/test_auto_machine.py`` turns
measuring on inside its ranks and checks that path; nothing is cached under the user's
home (a session's temporary folder instead). The package reads those settings once per
process; the fixture below makes a test's own ``monkeypatch`` changes take effect."""
from __future__ import annotations

import os
import tempfile

import pytest

from megatron_burst.comm import settings

os.environ.setdefault("MEGATRON_BURST_AUTO_MEASURE", "off")
os.environ.setdefault("MEGATRON_BURST_PROFILE_CACHE",
                      tempfile.mkdtemp(prefix="megatron-burst-profiles-"))


@pytest.fixture(autouse=True)
def _settings_follow_monkeypatch(monkeypatch):
    """The package reads its MEGATRON_BURST_* settings once per process
    (``megatron_burst.comm.settings``). Here each test starts from the environment as it is,
    and a variable a test sets or deletes with ``monkeypatch`` takes effect at once (a rank
    process forked by ``run_ranks`` reads its own at first use; a rank that changes a
    variable mid-run calls ``settings.reload()``)."""
    settings.forget()
    for name in ("setenv", "delenv"):
        def changed(*args, _real=getattr(monkeypatch, name), **kwargs):
            _real(*args, **kwargs)
            settings.forget()

        setattr(monkeypatch, name, changed)
    yield
    settings.forget()
