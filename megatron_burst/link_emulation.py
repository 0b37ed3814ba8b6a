"""The switch of the link emulator: ``$MEGATRON_BURST_EMULATE`` read in one place.

The emulator (`megatron_burst.tools.emulate`) is a benchmark tool: it slows the messages
between virtual nodes so that one NVLink host measures like a multi-node cluster. Both ways
into Megatron's training loop (this package's `megatron.pretrain_gpt` and Megatron-LM's
patched pretrain_gpt.py) call `megatron.entry.configure_run`, which calls
`maybe_emulate_links()` first. The core imports nothing from tools at import time: this
module reads the variable and imports the tool only when the variable is set. Unset (the
default) it imports nothing and changes nothing.
"""
from __future__ import annotations

import os
from typing import Any

ENV = "MEGATRON_BURST_EMULATE"  # e.g. "node_size=2,gbps=25,latency_us=5"


def maybe_emulate_links() -> Any:
    """Install the link emulator if ``$MEGATRON_BURST_EMULATE`` is set (rank 0 prints one line
    saying so); the installed `Emulation`, or None when the variable is unset."""
    if not os.environ.get(ENV):
        return None
    # The core's one import of tools, made only when the variable asks for the tool.
    from megatron_burst.tools.emulate import install_from_env

    return install_from_env()
