"""Whether a CPU's speed at the host's Python depends on which other CPUs are busy.

    python benchmarks/host_neighbours.py --out $OUT/neighbours

Why: on the lent GPU VMs a CPU runs a fixed piece of Python at one speed or about half it,
and which CPUs are slow changes within seconds (``host_cores.py``). The VM shows every CPU as
a core of its own (``/sys/devices/system/cpu/*/topology``), so an SMT sibling shared with a
busy thread would be hidden. This pins the timing thread to a target CPU and times
``host_cores.python_ms`` there alone, then with one spinning process pinned to each other
CPU in turn: a CPU whose spinner halves the target's speed shares its physical core now; a
spinner that speeds it up moved it (the hypervisor places virtual CPUs, not this VM).
Also records the machine's busy and steal time per CPU at idle, over two seconds.
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_cores import python_ms  # noqa: E402
from ranks import write_run  # noqa: E402

SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def idle_load(seconds: float = 2.0) -> dict[int, dict]:
    """Each CPU's busy and steal share (%) over ``seconds`` of this process sleeping."""
    def read() -> dict[int, list[int]]:
        with open("/proc/stat") as f:
            return {int(w[0][3:]): [int(x) for x in w[1:]] for w in map(str.split, f)
                    if w[0].startswith("cpu") and w[0][3:].isdigit()}
    a = read()
    time.sleep(seconds)
    b = read()
    out = {}
    for cpu in a:
        d = [y - x for x, y in zip(a[cpu], b[cpu])]
        total = max(1, sum(d))
        out[cpu] = dict(busy=round(100 * (1 - (d[3] + d[4]) / total), 1),
                        steal=round(100 * (d[7] if len(d) > 7 else 0) / total, 1))
    return out


def with_neighbours(target: int, cpus: list[int]) -> dict:
    """``python_ms`` on ``target`` alone (three times), then with a spinner on each other CPU."""
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {target})
    try:
        alone = [python_ms() for _ in range(3)]
        spun = {}
        for cpu in cpus:
            if cpu == target:
                continue
            spinner = subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)])
            try:
                time.sleep(0.15)  # the spinner running on its CPU before the timing
                spun[cpu] = python_ms()
            finally:
                spinner.kill()
                spinner.wait()
    finally:
        os.sched_setaffinity(0, mine)
    return dict(target=target, alone=alone, spun=spun)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="path prefix: writes OUT.json and OUT.md")
    p.add_argument("--targets", default=None,
                   help="comma-separated target CPUs (default: the third and a middle one)")
    args = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    targets = ([int(t) for t in args.targets.split(",")] if args.targets else
               sorted({cpus[min(2, len(cpus) - 1)], cpus[min(len(cpus) // 2 + 3, len(cpus) - 1)]}))
    if any(t not in cpus for t in targets):
        p.error(f"--targets must be CPUs of this process ({cpus}), got {targets}")
    load = idle_load()
    rows = [with_neighbours(t, cpus) for t in targets]
    meta = dict(cpus=len(cpus), date=datetime.date.today().isoformat(),
                command=" ".join(sys.argv), idle_load=load,
                loop="host_cores.python_ms(): 200,000 calls, median of 5")
    lines = [f"{len(cpus)} CPUs, {meta['date']}, command: `{meta['command']}`", "",
             f"busiest CPU at idle: {max(v['busy'] for v in load.values())}% busy, most "
             f"steal {max(v['steal'] for v in load.values())}%", ""]
    for r in rows:
        base = sorted(r["alone"])[1]
        slower = [c for c, ms in r["spun"].items() if ms > 1.5 * base]
        faster = [c for c, ms in r["spun"].items() if ms < base / 1.5]
        lines += [f"CPU {r['target']}: alone {', '.join(f'{x:.1f}' for x in r['alone'])} ms; "
                  f"with a spinner on each other CPU {min(r['spun'].values()):.1f}-"
                  f"{max(r['spun'].values()):.1f} ms; 1.5x slower with a spinner on "
                  f"{slower or 'none'}, 1.5x faster on {faster or 'none'}"]
    text = "\n".join(lines)
    print(text)
    write_run(args.out, meta, rows, text)


if __name__ == "__main__":
    main()
