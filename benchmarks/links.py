"""Past this machine: how the gradient exchange fares on slower links, measured between two hosts
and projected to more.

    sudo .venv/bin/python -m benchmarks.links [--links 10,1,0.1] [--steps 60] [--repeats 2]
                                              [--json FILE] [--chart FILE.png]

Two hosts in network namespaces (`benchmarks.hosts`), one rank each, run `hvd-train bench` on
synthetic data of mnist_cnn's shape: first on their bare link (a bridge, next to free), which
gives the projection (`hvd-train bench --links`), then with each host's sending rate-limited by a
`tc` token bucket to each link speed. Each with and without fp16 compression. It prints measured
against projected scaling efficiency for two hosts, and charts the projection against
hosts for each link. Each figure is the best of --repeats runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.hosts import HOSTS, Hosts, cannot_make_hosts, shape, two_hosts
from benchmarks.run import BIN, PYTHON, machine, results
from hvd_train.commands.bench import projected_efficiency

TOLERANCE = 0.15  # how far a projection may be from the shaped runs' figure


def bench(hosts: Hosts, steps: int, fp16: bool, links: list[float]) -> dict[str, Any]:
    """`hvd-train bench` with one rank on each host: rank 0's figures."""
    placement = ",".join(f"{name}:1" for name in HOSTS)
    command = [str(BIN / "horovodrun"), "-np", "2", "--gloo", "-H", placement,
               "--ssh-identity-file", str(hosts.key), "--network-interface", "eth0",
               PYTHON, "-m", "hvd_train", "bench", "--synthetic", "--json",
               "--steps", str(steps), "--set", f"fp16_compression={str(fp16).lower()}"]  # fmt: skip
    if links:
        command += ["--links", ",".join(f"{gbit:g}" for gbit in links)]
    # The two hosts share this machine's cores: one each, as the ranks of np=2 take them here.
    environment = os.environ | {"HVD_TRAIN_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=environment)
    if result.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{(result.stdout + result.stderr)[-3000:]}")
    [figures] = results([result.stdout])
    return figures


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return max(runs, key=lambda figures: figures["images_per_second"])


def chart(projections: dict[bool, dict[str, Any]], measured: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5), layout="constrained")
    hosts = [1, 2, 4, 8, 16, 32, 64]
    for number, gbit in enumerate(sorted({gbit for _, gbit in measured}, reverse=True)):
        for fp16, style, mark in ((False, "-", "o"), (True, "--", "x")):
            base = projections[fp16]
            efficiency = [1.0] + [projected_efficiency(base, n, gbit) for n in hosts[1:]]
            label = f"{gbit:g} Gbit/s" + (", fp16" if fp16 else "")
            axis.plot(hosts, efficiency, style, color=f"C{number}", label=label)
            axis.plot([2], [measured[fp16, gbit]], mark, color=f"C{number}")
    axis.plot([], [], "ko", label="measured, two hosts (x: fp16)")
    axis.set_xscale("log", base=2)
    axis.set_xticks(hosts, [str(n) for n in hosts])
    axis.set_ylim(0, 1.05)
    axis.set_xlabel("hosts (one rank each)")
    axis.set_ylabel("scaling efficiency (images/s over N x one rank alone)")
    axis.set_title("mnist_cnn, 64 images per rank and step: projected from two hosts")
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small")
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", default="10,1,0.1", help="Gbit/s, comma-separated")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--chart", type=Path, help="draw the projected efficiency here")
    args = parser.parse_args()
    reason = cannot_make_hosts()
    if reason:
        sys.exit(f"benchmarks.links: {reason}")
    links = [float(gbit) for gbit in args.links.split(",")]
    runs: dict[tuple[bool, float | None], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as work, two_hosts(Path(work)) as hosts:
        for _ in range(args.repeats):  # interleaved, so that slow spells hit every link
            for fp16 in (False, True):
                for gbit in [None, *links]:  # None: the bare link, the projection's base
                    shape(hosts, gbit)
                    figures = bench(hosts, args.steps, fp16, [] if gbit else links)
                    runs.setdefault((fp16, gbit), []).append(figures)
        shape(hosts, None)
    bases = {fp16: best(runs[fp16, None]) for fp16 in (False, True)}
    measured, rows = {}, []
    for (fp16, gbit), figures in runs.items():
        if gbit is None:
            continue
        got, projected = best(figures), projected_efficiency(bases[fp16], 2, gbit)
        # Efficiencies, not images/s: each run's own limit takes out how fast the machine was.
        measured[fp16, gbit] = got["scaling_efficiency"]
        rows.append({"fp16": fp16, "gbit_per_s": gbit, "step_ms": got["step_ms"],
                     "t_sync_ms": got["t_sync_ms"], "images_per_second": got["images_per_second"],
                     "measured_efficiency": got["scaling_efficiency"],
                     "projected_efficiency": round(projected, 3)})  # fmt: skip
    print(f"two hosts, one rank each, mnist_cnn (synthetic data), {args.steps} steps, best of "
          f"{args.repeats}; {machine()}")  # fmt: skip
    print("                           measured                      scaling efficiency")
    print("  link         fp16   step ms  T_sync ms  images/s    measured  projected  ratio")
    for row in rows:
        ratio = row["projected_efficiency"] / row["measured_efficiency"]
        verdict = "" if abs(ratio - 1) <= TOLERANCE else f"  (off by more than {TOLERANCE:.0%})"
        print(f"  {row['gbit_per_s']:5g} Gbit/s {'yes' if row['fp16'] else 'no':>5} "
              f"{row['step_ms']:9.1f} {row['t_sync_ms']:10.1f} {row['images_per_second']:9.0f} "
              f"{100 * row['measured_efficiency']:10.1f} % "
              f"{100 * row['projected_efficiency']:7.1f} % {ratio:6.2f}{verdict}")  # fmt: skip
    for fp16, base in bases.items():
        what = "projected scaling efficiency" + (" with fp16" if fp16 else "")
        print(f"\n{what}, from the bare link ({base['images_per_second']:.0f} images/s, "
              f"step {base['step_ms']} ms):")  # fmt: skip
        for gbit, by_hosts in base["projection"].items():
            cells = ", ".join(f"{n}: {100 * e:.0f} %" for n, e in by_hosts.items())
            print(f"  {gbit:>5} Gbit/s  {cells}")
    if args.json:
        figures = {"machine": machine(), "rows": rows, "bare_link": bases}
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    if args.chart:
        chart(bases, measured, args.chart)


if __name__ == "__main__":
    main()
