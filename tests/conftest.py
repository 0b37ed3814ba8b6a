"""The suite's settings: 'auto' decides from the shipped profile here, as it did before it
measured machines at first use, so that the hundreds of CPU cases that leave ``backward``
to 'auto' keep deterministic choices and their speed. ``tests/test_auto_machine.py`` turns
measuring on inside its ranks and checks that path; nothing is cached under the user's
home (a session's temporary folder instead)."""
from __future__ import annotations

import os
import tempfile

os.environ.setdefault("MEGATRON_BURST_AUTO_MEASURE", "off")
os.environ.setdefault("MEGATRON_BURST_PROFILE_CACHE",
                      tempfile.mkdtemp(prefix="megatron-burst-profiles-"))
