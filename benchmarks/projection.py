"""A projection, not a measurement: the shipped A100 configs on nodes joined by 25 or 50 GB/s.

    python benchmarks/projection.py --out benchmarks/results/projection_a100.json
    python benchmarks/projection.py --readme README.md   # rewrite the README's table from it

For every shipped config on A100 nodes of 8 GPUs, and an inter-node link of 25 and 50 GB/s
per GPU (the a100-ib profile with its `inter` link replaced; NVLink inside a node as
profiled), the time model `megatron-burst plan` uses (`launch.planning.step_time.predict_step`, on
the topology `options.resolve` picks for the config's options with that profile) gives: the
step time, tokens/s per GPU, MFU, the topology chosen, and the share of the step the ring
waits on links. The run is scaled by data parallelism to 1,024 GPUs, each replica keeping
its share of the global batch; the model leaves out the data-parallel gradient reduction,
so tokens/s per GPU does not change with it (a real run loses some).

Every row is a projection from a model that was checked only on one NVLink host: its
attention time within 15% of the measured in 48 of 56 rows (4 H200), its step time
calibrated on the end-to-end runs on file (``tools.calibration``). No slow link has been
measured (issue 27's emulated runs were not made: no device time left). Writes JSON and a
markdown table beside it; ``--readme`` writes the README's table (``README_CONFIGS``, at the
first link rate) between its two marker lines, which a test regenerates and compares.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from megatron_burst.launch.config.schema import load_config, with_nodes  # noqa: E402
from megatron_burst.launch.planning.step_time import predict_step  # noqa: E402
from megatron_burst.launch.config.burst import topology_of  # noqa: E402
from megatron_burst.decide.timing import PROFILES_DIR  # noqa: E402

MODEL_ERROR = ("attention time within 15% in 48/56 NVLink rows; step time calibrated on the "
               "end-to-end runs on file (tools.calibration); no slow link measured")
README_CONFIGS = ("llama2-70b-512k", "llama2-7b-32k", "llama3-8b-128k", "llama3-8b-1m")
README_BEGIN = "<!-- projection table: python benchmarks/projection.py --readme README.md -->"
README_END = "<!-- end of the projection table -->"


def profile_with_inter(gbps: float, folder: str) -> str:
    """The a100-ib profile with its inter-node link at ``gbps`` GB/s per GPU (a file)."""
    raw = json.loads((PROFILES_DIR / "a100-ib.json").read_text())
    raw["inter"] = dict(raw["inter"], gbps=gbps, points=[])
    raw["name"] = f"a100-ib-{gbps:g}"
    raw["source"] = f"a100-ib with its inter-node link set to {gbps:g} GB/s (a projection)"
    path = os.path.join(folder, f"a100-{gbps:g}.json")
    with open(path, "w") as f:
        json.dump(raw, f)
    return path


def rows_for(path: pathlib.Path, gbps: float, profile: str) -> list[dict]:
    cfg = load_config(path)
    if cfg.cluster.gpu != "a100-80gb":
        return []
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, profile=profile))
    model_parallel = cfg.parallel.tensor * cfg.parallel.context * cfg.parallel.pipeline
    out = []
    for gpus in sorted({cfg.cluster.world_size, 1024}):
        nodes = gpus // cfg.cluster.gpus_per_node
        if gpus % model_parallel or nodes < 1:
            continue
        sized = with_nodes(cfg, nodes)
        # Weak scaling: each data-parallel replica keeps its share of the global batch.
        grow = sized.parallel.data // cfg.parallel.data
        sized = dataclasses.replace(sized, training=dataclasses.replace(
            sized.training, global_batch_size=cfg.training.global_batch_size * grow))
        step = predict_step(sized)
        topology = topology_of(sized)
        exposed = (step.layers * step.attention.exposed_comm_s * step.microbatches
                   / step.step_s)
        out.append(dict(config=path.stem, inter_gbps=gbps, gpus=gpus, nodes=nodes,
                        topology=topology.describe(), step_s=step.step_s,
                        tokens_per_s_per_gpu=step.tokens_per_s_per_gpu, mfu=step.mfu,
                        link_exposed_share=exposed, projection=True,
                        model_error=MODEL_ERROR))
    return out


def project(links: list[float], names: tuple[str, ...] | None = None) -> list[dict]:
    """The rows of every shipped A100 config (or of ``names``) at each link rate."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for gbps in links:
            profile = profile_with_inter(gbps, folder)
            for path in sorted((ROOT / "configs").glob("*.yaml")):
                if names is None or path.stem in names:
                    rows += rows_for(path, gbps, profile)
    return rows


def readme_table(rows: list[dict]) -> list[str]:
    """The README's table: each of README_CONFIGS at the first link rate in ``rows``."""
    gbps = rows[0]["inter_gbps"]
    lines = ["| config | GPUs | topology (resolved) | step s | tokens/s/GPU | MFU | ring waiting "
             "on links |", "|---|---|---|---|---|---|---|"]
    for name in README_CONFIGS:
        mine = [r for r in rows if r["config"] == name and r["inter_gbps"] == gbps]
        r = mine[0]
        lines.append(f"| {name} | {' .. '.join(str(x['gpus']) for x in mine)} | "
                     f"{r['topology']} | {r['step_s']:.1f} | {r['tokens_per_s_per_gpu']:.0f} | "
                     f"{r['mfu']:.2f} | {r['link_exposed_share']:.1%} of the step |")
    return lines


def with_readme_table(text: str, lines: list[str]) -> str:
    """``text`` (the README) with the lines between its projection markers replaced."""
    head, rest = text.split(README_BEGIN + "\n", 1)
    _, tail = rest.split(README_END, 1)
    return head + README_BEGIN + "\n" + "\n".join(lines) + "\n" + README_END + tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", default="25,50", help="inter-node GB/s per GPU")
    parser.add_argument("--out", help="the JSON file (and a .md beside it)")
    parser.add_argument("--readme", help="rewrite this README's projection table")
    args = parser.parse_args()
    links = [float(x) for x in args.links.split(",")]
    if args.readme:
        path = pathlib.Path(args.readme)
        rows = project(links, README_CONFIGS)
        path.write_text(with_readme_table(path.read_text(), readme_table(rows)))
        print(f"wrote the projection table of {path}")
    if not args.out:
        return
    rows = project(links)
    meta = dict(command=" ".join(["python"] + sys.argv), date=time.strftime("%Y-%m-%d"),
                note="PROJECTION from the time model; " + MODEL_ERROR)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    lines = [f"Projection (not measured), {meta['date']}: `{meta['command']}`",
             f"Model error: {MODEL_ERROR}. Per-GPU figures are the model's at the config's "
             f"size and at 1,024 GPUs alike (data parallelism; its gradient reduction is not "
             f"modelled).", "",
             "| config | GPUs | link between nodes | topology (resolved) | step s | tokens/s/GPU | "
             "MFU | ring waiting on links |", "|---|---|---|---|---|---|---|---|"]
    seen = set()
    for r in rows:
        key = (r["config"], r["inter_gbps"])
        if key in seen:
            continue
        seen.add(key)
        sizes = sorted({x["gpus"] for x in rows if (x["config"], x["inter_gbps"]) == key})
        lines.append(f"| {r['config']} | {' .. '.join(map(str, sizes))} | "
                     f"{r['inter_gbps']:g} GB/s | {r['topology']} | {r['step_s']:.1f} | "
                     f"{r['tokens_per_s_per_gpu']:.0f} | {r['mfu']:.2f} | "
                     f"{r['link_exposed_share']:.1%} of the step |")
    md = "\n".join(lines) + "\n"
    pathlib.Path(args.out).with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
