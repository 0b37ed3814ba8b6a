"""``benchmarks/attention.py``'s time-model column for a windowed call: priced as 'auto'
prices a window (``predict_scheduled``), not as the whole causal sequence."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import attention  # noqa: E402

from megatron_burst.decide import timing  # noqa: E402
from megatron_burst.decide.options import BurstOptions, resolve  # noqa: E402
from megatron_burst.decide.scheduled_time import predict_scheduled  # noqa: E402
from megatron_burst.decide.topology import HeadShape  # noqa: E402


def test_a_windowed_call_is_priced_with_its_window():
    topology = resolve(BurstOptions(backward="ring"), cp=4, heads=HeadShape(64, 8, 128, 2),
                       tokens=8192, max_intra_node_size=None, causal=True)
    whole = attention.predicted_ms(topology, 8192, True, (-1, -1))
    window = attention.predicted_ms(topology, 8192, True, (1024, 0))
    prof = timing.load_profile()
    assert whole == timing.predict(topology, prof, tokens=8192, causal=True).total_s * 1e3
    assert window == predict_scheduled(topology, prof, batch=1, s_local=8192, window=(1024, 0),
                                       causal=True).total_s * 1e3
    assert window < whole / 2  # a 1K window over 32K tokens is a fraction of causal's work
