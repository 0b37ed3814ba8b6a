"""Issue 39's CPU proxy: Python calls per CP=2 fwd+bwd on gloo ranks, for any package.

    python benchmarks/python_calls.py --out benchmarks/results/cpu_issue39_proxy/after.json
    PYTHONPATH=OLD_TREE python benchmarks/python_calls.py --out .../before.json

The counting is ``tests/test_host_path.py``'s (``_cp2_counts``: every function and C builtin
call ``sys.setprofile`` sees during one call's forward and backward, the user's
``.backward()`` included, after three warm-up calls; a plain causal call with either
backward, and a new ``whole_docs`` pack every call), run on the package ``PYTHONPATH`` puts
first, so two packages are counted by the same code. Each rank's counts go in the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    sys.path.append(ROOT)  # the repository's tests, after $PYTHONPATH's package
    import megatron_burst
    from tests.distributed import run_ranks
    from tests.test_host_path import _cp2_counts

    counts = run_ranks(2, _cp2_counts, timeout=600)
    result = {"meta": {"package": os.path.dirname(megatron_burst.__file__), "device": "CPU",
                       "command": " ".join(["python", *sys.argv])},
              "ranks": [{k: v for k, v in c.items() if k != "environment read"}
                        for c in counts]}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
