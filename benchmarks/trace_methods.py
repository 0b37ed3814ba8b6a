"""Where two methods' calls part, from an ``auto_check.py --trace`` trace (CPU only).

    python benchmarks/trace_methods.py TRACE.json [--against "flat ring 2, ring bwd"]

``auto_check`` labels each call of a traced turn ``method:NAME`` (``torch.profiler``'s
``record_function``). For each method: its calls' median host duration, and per call the
total duration of every operator the host ran inside them (nested ones counted in their
parents too); then the operators whose per-call time differs most between ``auto`` and
``--against`` (name the forced row with auto's topology: the trace does not say which it
is). Prints a table; ``--json`` writes it too.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from op_spans import ops_in_spans  # noqa: E402


def per_method(events: list[dict]) -> dict[str, dict]:
    """method -> {"calls": n, "median_us": host duration, "ops": {op: us per call}}."""
    spans = [e for e in events if str(e.get("name", "")).startswith("method:")
             and e.get("ph") == "X"]
    ops = [(e["name"], e.get("tid"), e["ts"], e["dur"]) for e in events
           if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    out: dict[str, dict] = {}
    for name in sorted({s["name"] for s in spans}):
        mine = [s for s in spans if s["name"] == name]
        totals = ops_in_spans([(name, s.get("tid"), s["ts"], s["dur"]) for s in mine], ops)
        out[name[len("method:"):]] = dict(
            calls=len(mine), median_us=statistics.median(s["dur"] for s in mine),
            ops={op: us / len(mine) for op, us in totals.items()})
    return out


def differences(methods: dict, a: str, b: str, top: int = 15) -> list[tuple[str, float, float]]:
    """(op, a's us per call, b's) for the ``top`` operators that differ most."""
    ops_a, ops_b = methods[a]["ops"], methods[b]["ops"]
    names = sorted(set(ops_a) | set(ops_b),
                   key=lambda op: -abs(ops_a.get(op, 0.0) - ops_b.get(op, 0.0)))
    return [(op, ops_a.get(op, 0.0), ops_b.get(op, 0.0)) for op in names[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--against", required=True, help="the other method's name")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with open(args.trace) as f:
        methods = per_method(json.load(f)["traceEvents"])
    for name, m in methods.items():
        print(f"{name:<36} {m['calls']} calls, median {m['median_us'] / 1e3:.3f} ms host")
    rows = differences(methods, "auto", args.against)
    print(f"\n{'operator':<60} {'auto us':>10} {'other us':>10}")
    for op, a, b in rows:
        print(f"{op[:60]:<60} {a:10.1f} {b:10.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(trace=args.trace, against=args.against, methods={
                n: {k: v for k, v in m.items() if k != "ops"} for n, m in methods.items()},
                differences=rows), f, indent=1)


if __name__ == "__main__":
    main()
