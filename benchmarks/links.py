"""Across two hosts on links of a given speed: hvd_train against DDP and against the limit.

    sudo .venv/bin/python -m benchmarks.links [--recipe resnet18] [--links 10,1] [--steps 12]
                                              [--repeats 2] [--json] [--chart FILE.png]
                                              [--sharding]

Two hosts in network namespaces (`benchmarks.hosts`), one rank each, each host's sending
rate-limited by a `tc` token bucket to each link speed, train the recipe on synthetic data of its
shape, one system after another:

  hvd_train               `hvd-train bench`, torch, overlap as the recipe says ("auto")
  hvd_train_no_overlap    the same with `overlap=false`: one group after the backward pass
  overlap_on              the same with `overlap=true` (so that "auto" is checked against the
                          faster of the two in each round)
  hvd_train_bf16          the same with `compression=bf16`: gradients sent as bf16
  ddp                     torch's DistributedDataParallel (Gloo, default buckets), started by
                          torchrun on each host with c10d rendezvous over the same link
  ddp_bf16                the same with torch's bf16_compress_hook
  tensorflow              `hvd-train bench --framework tensorflow`
  limit                   the same two ranks training with no exchange at all, at once (the
                          torch bench's second phase; `tensorflow_limit` likewise)
  ddp_limit               DDP's own steps under `no_sync`, sending nothing: with `limit`, it
                          tells a slower exchange from slower passes

With --sharding, the sharded systems instead, each stage beside torch's system of the same
stage, and hvd_train, ddp and tensorflow of the same round (the results go to
docs/results/links-sharding.json):

  hvd_train_optimizer     `hvd-train bench` with `horovod.shard="optimizer"` (ZeRO-1)
  zero                    DDP with torch's ZeroRedundancyOptimizer (ZeRO-1)
  hvd_train_gradients     `hvd-train bench` with `horovod.shard="gradients"` (ZeRO-2)
  fsdp2                   torch's FSDP2, `fully_shard` per residual block and on the model,
                          no reshard after forward (ZeRO-2); its SGD in torch's foreach form
  tensorflow_optimizer,   the TensorFlow stages
  tensorflow_gradients

Every system sees the same model, data, batch per rank and optimizer, one thread per rank (the
two hosts share this machine's cores). Each figure is the best of --repeats rounds, and each
ratio the best of the ratios taken within one round. First, on the bare link, `hvd-train bench
--links` projects each hvd_train torch run's scaling efficiency; the shaped runs check it. The
bytes each system copies per step, which do not depend on the link, come from
`benchmarks.copies`, run before everything. Each round also keeps where the torch systems'
step time went (`parts`: the step, the same step sending nothing, and hvd_train's split into
passes, the wait for the exchange and the rest).
`--json` prints one object; otherwise a table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import copies
from benchmarks.hosts import HOSTS, Hosts, cannot_make_hosts, shape, two_hosts
from benchmarks.run import BIN, PYTHON, ROOT, machine, results
from hvd_train.commands.bench import projected_efficiency
from hvd_train.frameworks import FRAMEWORKS

TOLERANCE = 0.15  # how far a projection may be from the shaped runs' figure
RDZV_PORT = 29511
SYSTEMS = ("hvd_train", "hvd_train_no_overlap", "hvd_train_bf16", "ddp", "ddp_bf16",
           "tensorflow")  # fmt: skip
# Each stage: hvd_train's torch run, torch's own system, hvd_train's TensorFlow run.
STAGES = {"optimizer": ("hvd_train_optimizer", "zero", "tensorflow_optimizer"),
          "gradients": ("hvd_train_gradients", "fsdp2", "tensorflow_gradients")}  # fmt: skip
SHARDED = tuple(name for systems in STAGES.values() for name in systems)
STAGES_TORCH = tuple(name for name in SHARDED if not name.startswith("tensorflow"))
LIMITS = {name: "tensorflow_limit" if name == "tensorflow" else "limit" for name in SYSTEMS}
# The two hosts share this machine's cores: one each, as the ranks of np=2 take them here.
ONE_THREAD = {"HVD_TRAIN_THREADS": "1", "THREADS": "1"}


def environment() -> dict[str, str]:
    return {**FRAMEWORKS["tensorflow"].environment, **os.environ, **ONE_THREAD,
            "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}  # fmt: skip


def checked(jobs: list[subprocess.Popen[str]], timeout: float = 1800) -> list[str]:
    """The jobs' outputs, once all have ended well. Where one fails, or `timeout` passes, the
    others are stopped, each with its process group (started with `start_new_session`): a
    torchrun whose peer host has gone waits for it for good. The error names the job that
    failed (or those that ran out of time), with the end of its output."""
    outputs: dict[int, str] = {}

    def read(number: int) -> None:
        outputs[number] = jobs[number].communicate()[0]

    readers = [threading.Thread(target=read, args=(number,)) for number in range(len(jobs))]
    for reader in readers:
        reader.start()
    deadline, stopped = time.monotonic() + timeout, set()
    while any(job.poll() is None for job in jobs):
        failed = any(job.poll() not in (None, 0) for job in jobs)
        if failed or time.monotonic() > deadline:
            stopped = {number for number, job in enumerate(jobs) if job.poll() is None}
            for number in stopped:
                os.killpg(jobs[number].pid, signal.SIGKILL)
            break
        time.sleep(0.5)
    for reader in readers:
        reader.join()
    for number, job in enumerate(jobs):
        if job.wait() != 0 and number not in stopped:
            raise RuntimeError(f"{job.args} exited {job.returncode}:\n{outputs[number][-3000:]}")
    if stopped:
        late = [jobs[number].args for number in sorted(stopped)]
        raise RuntimeError(f"still running after {timeout:.0f} s, and stopped: {late}")
    return [outputs[number] for number in range(len(jobs))]


def bench(hosts: Hosts, recipe: str, steps: int, extra: list[str]) -> dict[str, Any]:
    """`hvd-train bench` with one rank on each host: rank 0's figures."""
    placement = ",".join(f"{name}:1" for name in HOSTS)
    command = [str(BIN / "horovodrun"), "-np", "2", "--gloo", "-H", placement,
               "--ssh-identity-file", str(hosts.key), "--network-interface", "eth0",
               PYTHON, "-m", "hvd_train", "bench", "--recipe", recipe, "--synthetic", "--json",
               "--steps", str(steps), "--warmup", "8", *extra]  # fmt: skip
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=environment(), cwd=ROOT, start_new_session=True)  # fmt: skip
    [figures] = results(checked([job]))
    return figures


# The c10d rendezvous store, in a process of its own on the first host until its stdin closes.
STORE = ("import sys, torch.distributed as d; "
         "store = d.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=True, "
         "wait_for_workers=False); sys.stdin.read()")  # fmt: skip


def torchrun(hosts: Hosts, recipe: str, steps: int, mode: str = "ddp") -> dict[str, float]:
    """A torch system's figures (`benchmarks.torch_baselines` MODE: DDP's images/s and its own
    limit under no_sync; "ddp_bf16" sends bf16; "zero" and "fsdp2" shard): torchrun on each
    host (inside its namespace), c10d rendezvous at the first host, Gloo over the hosts'
    link. The rendezvous store is neither agent's: where the first host's agent kept it, the
    other agent, still leaving, failed at times on finding it gone (`RendezvousConnectionError`
    after its worker had printed its figures)."""
    jobs, gloo = [], environment() | {"GLOO_SOCKET_IFNAME": "eth0"}
    first = HOSTS["hvd-host-a"]
    store = subprocess.Popen(["ip", "netns", "exec", hosts.namespaces[0], PYTHON, "-c", STORE,
                              first, str(RDZV_PORT)], stdin=subprocess.PIPE, cwd=ROOT,
                             start_new_session=True)  # fmt: skip
    try:
        for namespace, address in zip(hosts.namespaces, HOSTS.values(), strict=True):
            # Each host is reached at its own address (the namespace has no host name).
            command = ["ip", "netns", "exec", namespace, PYTHON, "-m", "torch.distributed.run",
                       "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", f"{first}:{RDZV_PORT}", "--rdzv-id", "links",
                       "--rdzv-conf", "is_host=false", "--local-addr", address,
                       "-m", "benchmarks.torch_baselines", mode, recipe, str(steps)]  # fmt: skip
            jobs.append(subprocess.Popen(command, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=gloo,
                                         start_new_session=True))  # fmt: skip
        [figures] = results(checked(jobs))
    finally:
        store.communicate(timeout=60)  # its stdin closed: it ends
    return figures


def parts(figures: dict[str, Any], global_batch: int) -> dict[str, float]:
    """Where a step's time went, in ms: the step, and the same step with nothing sent (the
    limit's). hvd_train's also splits it as its summary does (passes, wait for the exchange,
    the rest); DDP's is known from its images/s alone (and its no_sync steps')."""
    if "step_ms" in figures:  # hvd-train bench
        return {key: figures[key] for key in
                ("step_ms", "local_step_ms", "t_comp_ms", "t_sync_ms", "t_other_ms")}  # fmt: skip
    step = {"step_ms": round(1000 * global_batch / figures["images_per_second"], 2)}
    if "local_images_per_second" not in figures:  # zero, fsdp2
        return step
    return step | {"local_step_ms": round(1000 * global_batch / figures["local_images_per_second"],
                                          2)}  # fmt: skip


def round_of(hosts: Hosts, recipe: str, steps: int) -> dict[str, Any]:
    """One round of every system on the link as it is shaped now: images/s by name, and where
    the time of the torch systems' steps went (`parts`)."""
    torch = bench(hosts, recipe, steps, [])
    no_overlap = bench(hosts, recipe, steps, ["--set", "overlap=false"])
    overlap_on = bench(hosts, recipe, steps, ["--set", "overlap=true"])
    bf16 = bench(hosts, recipe, steps, ["--set", "compression=bf16"])
    plain = torchrun(hosts, recipe, steps)
    plain_bf16 = torchrun(hosts, recipe, steps, "ddp_bf16")
    tensorflow = bench(hosts, recipe, steps, ["--framework", "tensorflow"])
    batch = torch["global_batch"]
    return {
        "hvd_train": torch["images_per_second"],
        "hvd_train_no_overlap": no_overlap["images_per_second"],
        "overlap_on": overlap_on["images_per_second"],
        "hvd_train_bf16": bf16["images_per_second"],
        "ddp": plain["images_per_second"],
        "ddp_bf16": plain_bf16["images_per_second"],
        "ddp_limit": plain["local_images_per_second"],
        "tensorflow": tensorflow["images_per_second"],
        "limit": torch["limit_images_per_second"],
        "tensorflow_limit": tensorflow["limit_images_per_second"],
        "efficiency": torch["scaling_efficiency"],
        "efficiency_no_overlap": no_overlap["scaling_efficiency"],
        "overlapped": torch["overlapped"],
        "parts": {name: parts(figures, batch) for name, figures in
                  (("hvd_train", torch), ("hvd_train_no_overlap", no_overlap),
                   ("hvd_train_bf16", bf16), ("ddp", plain), ("ddp_bf16", plain_bf16))},
    }  # fmt: skip


def sharding_round(hosts: Hosts, recipe: str, steps: int) -> dict[str, Any]:
    """One round of the sharded systems, and of the unsharded ones they are set against, on the
    link as it is shaped now: images/s by name, and where the torch systems' time went."""
    tensorflow = ["--framework", "tensorflow"]
    figures = {"hvd_train": bench(hosts, recipe, steps, []),
               "ddp": torchrun(hosts, recipe, steps),
               "tensorflow": bench(hosts, recipe, steps, tensorflow)}  # fmt: skip
    for stage, (ours, theirs, keras) in STAGES.items():
        shard = ["--set", f'horovod.shard="{stage}"']
        figures[ours] = bench(hosts, recipe, steps, shard)
        figures[theirs] = torchrun(hosts, recipe, steps, theirs)
        figures[keras] = bench(hosts, recipe, steps, [*shard, *tensorflow])
    batch = figures["hvd_train"]["global_batch"]
    return {
        **{name: system["images_per_second"] for name, system in figures.items()},
        "parts": {name: parts(figures[name], batch)
                  for name in ("hvd_train", "ddp", *STAGES_TORCH)},
    }  # fmt: skip


def chosen_vs_best(figures: dict[str, Any]) -> float:
    """The setting "auto" chose in a round, by that setting's own run, over the faster of
    overlap on and off: whether it chose right. Auto decides during the warm-up, so its timed
    steps run that setting, and its own figure differs from it only by the noise between two
    runs of one configuration."""
    chosen = figures["overlap_on" if figures["overlapped"] else "hvd_train_no_overlap"]
    return round(chosen / max(figures["hvd_train_no_overlap"], figures["overlap_on"]), 3)


def summary(gbit: float, rounds: list[dict[str, Any]], bare: dict[str, Any]) -> dict[str, Any]:
    """The best of the rounds at one link speed, with each system's best ratio to its limit."""
    row: dict[str, Any] = {"gbit_s": gbit}
    for name in (*SYSTEMS, "limit", "tensorflow_limit"):
        row[name] = max(figures[name] for figures in rounds)
    row["of_limit"] = {name: round(max(f[name] / f[LIMITS[name]] for f in rounds), 3)
                       for name in SYSTEMS}  # fmt: skip
    row["hvd_train_vs_ddp"] = round(max(f["hvd_train"] / f["ddp"] for f in rounds), 3)
    row["ddp_limit"] = max(f["ddp_limit"] for f in rounds)
    row["ddp_of_own_limit"] = round(max(f["ddp"] / f["ddp_limit"] for f in rounds), 3)
    row["bf16_vs_ddp_bf16"] = round(max(f["hvd_train_bf16"] / f["ddp_bf16"] for f in rounds), 3)
    # "auto" against the faster of overlap on and off, in each round (its target: >= 0.97).
    row["auto_vs_best"] = [
        round(f["hvd_train"] / max(f["hvd_train"], f["hvd_train_no_overlap"], f["overlap_on"]), 3)
        for f in rounds
    ]
    row["chosen_vs_best"] = [chosen_vs_best(f) for f in rounds]
    row["overlapped"] = [f["overlapped"] for f in rounds]
    row["projected"] = {
        name: round(projected_efficiency(bare[name], 2, gbit), 3)
        for name in ("hvd_train", "hvd_train_no_overlap")
    }
    row["measured_efficiency"] = {
        "hvd_train": max(f["efficiency"] for f in rounds),
        "hvd_train_no_overlap": max(f["efficiency_no_overlap"] for f in rounds),
    }
    return row


def sharding_summary(gbit: float, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The best of the sharding rounds at one link speed, and each stage against hvd_train
    unsharded (the same framework's) and against torch's system of the stage (targets: >= 0.95
    and >= 1.0), the best of the ratios taken within one round."""
    row: dict[str, Any] = {"gbit_s": gbit}
    for name in ("hvd_train", "ddp", "tensorflow", *SHARDED):
        row[name] = max(f[name] for f in rounds)
    for stage, (ours, theirs, keras) in STAGES.items():
        row[stage] = {
            "vs_unsharded": round(max(f[ours] / f["hvd_train"] for f in rounds), 3),
            "vs_torch": round(max(f[ours] / f[theirs] for f in rounds), 3),
            "tensorflow_vs_unsharded": round(max(f[keras] / f["tensorflow"] for f in rounds), 3),
            "torch_vs_ddp": round(max(f[theirs] / f["ddp"] for f in rounds), 3),
        }
    return row


def chart(figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4), layout="constrained")
    width = 0.8 / len(SYSTEMS)
    for number, name in enumerate(SYSTEMS):
        middle = (len(SYSTEMS) - 1) / 2
        places = [i + (number - middle) * width for i in range(len(figures["links"]))]
        shares = [row["of_limit"][name] for row in figures["links"]]
        axis.bar(places, shares, width, label=name.replace("_", " "))
    axis.set_xticks(range(len(figures["links"])),
                    [f"{row['gbit_s']:g} Gbit/s" for row in figures["links"]])  # fmt: skip
    axis.set_ylim(0, 1.05)
    axis.set_ylabel("images/s over the limit (no exchange)")
    axis.set_title(f"{figures['recipe']}, two hosts of one rank, {figures['gradient_mb']:.0f} MB "
                   "of gradients a step")  # fmt: skip
    axis.grid(axis="y", alpha=0.3)
    axis.legend(fontsize="small", ncols=2)
    figure.savefig(path, dpi=100)


def table(figures: dict[str, Any]) -> str:
    header = "".join(f"{name:>22}" for name in (*SYSTEMS, "limit"))
    lines = [f"{figures['recipe']} on two hosts, one rank each, {figures['gradient_mb']} MB of "
             f"gradients a step; best of {figures['repeats']}; {figures['machine']}",
             f"  link         {header}"]  # fmt: skip
    for row in figures["links"]:
        cells = "".join(f"{row[name]:9.1f} ({row['of_limit'][name]:.2f})".rjust(22)
                        for name in SYSTEMS)  # fmt: skip
        lines.append(f"  {row['gbit_s']:5g} Gbit/s {cells}{row['limit']:22.1f}")
    lines.append("  images/s (the best ratio to its limit in one round); hvd_train over DDP:")
    for row in figures["links"]:
        checks = []
        for name, projected in row["projected"].items():
            measured = row["measured_efficiency"][name]
            off = abs(projected / measured - 1) > TOLERANCE
            checks.append(f"{name} {measured:.3f} / {projected:.3f}"
                          + (f" (off by more than {TOLERANCE:.0%})" if off else ""))  # fmt: skip
        auto = ", ".join(f"{share:.2f}" for share in row["auto_vs_best"])
        lines.append(f"  {row['gbit_s']:5g} Gbit/s  {row['hvd_train_vs_ddp']:.2f}x, bf16 "
                     f"{row['bf16_vs_ddp_bf16']:.2f}x; auto over the faster of overlap on and "
                     f"off: {auto}; scaling "
                     f"efficiency measured / projected: {', '.join(checks)}")  # fmt: skip
    copied = ", ".join(f"{name} {figures['copied_mb_per_step'][name]['total_mb']:.1f}"
                       for name in copies.SYSTEMS)  # fmt: skip
    lines.append(f"  MB copied per step: {copied}")
    return "\n".join(lines)


def sharding_table(figures: dict[str, Any]) -> str:
    lines = [f"{figures['recipe']} on two hosts, one rank each, sharded; images/s, best of "
             f"{figures['repeats']}, and the best ratio within one round against hvd_train "
             f"unsharded (the same framework's) and torch's system of the stage; "
             f"{figures['machine']}"]  # fmt: skip
    for row in figures["links"]:
        lines.append(f"  {row['gbit_s']:g} Gbit/s: hvd_train {row['hvd_train']:.1f}, DDP "
                     f"{row['ddp']:.1f}, tensorflow {row['tensorflow']:.1f}")  # fmt: skip
        for stage, (ours, theirs, keras) in STAGES.items():
            ratios = row[stage]
            lines.append(f"    {stage:>10}: {ours} {row[ours]:.1f} ({ratios['vs_unsharded']:.2f}x "
                         f"unsharded, {ratios['vs_torch']:.2f}x {theirs} {row[theirs]:.1f}); "
                         f"{keras} {row[keras]:.1f} "
                         f"({ratios['tensorflow_vs_unsharded']:.2f}x unsharded)")  # fmt: skip
    return "\n".join(lines)


def sharding(args: argparse.Namespace, links: list[float]) -> None:
    """--sharding: the rounds of the sharded systems only, printed."""
    rounds: dict[float, list[dict[str, Any]]] = {gbit: [] for gbit in links}
    with tempfile.TemporaryDirectory() as work, two_hosts(Path(work)) as hosts:
        for _ in range(args.repeats):  # interleaved, so that slow spells hit every link
            for gbit in links:
                shape(hosts, gbit)
                rounds[gbit].append(sharding_round(hosts, args.recipe, args.steps))
        shape(hosts, None)
    figures = {"recipe": args.recipe, "machine": machine(), "repeats": args.repeats,
               "steps": args.steps,
               "links": [sharding_summary(gbit, rounds[gbit]) for gbit in links],
               "rounds": {f"{gbit:g}": rounds[gbit] for gbit in links}}  # fmt: skip
    print(json.dumps(figures, indent=2) if args.json else sharding_table(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="resnet18")
    parser.add_argument("--links", default="10,1", help="Gbit/s, comma-separated")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--chart", type=Path, help="draw each system's share of the limit here")
    parser.add_argument("--sharding", action="store_true",
                        help="the sharded systems, against unsharded and torch's")  # fmt: skip
    args = parser.parse_args()
    reason = cannot_make_hosts()
    if reason:
        sys.exit(f"benchmarks.links: {reason}")
    links = [float(gbit) for gbit in args.links.split(",")]
    if args.sharding:
        sharding(args, links)
        return
    rounds: dict[float, list[dict[str, Any]]] = {gbit: [] for gbit in links}
    copied = copies.measure(args.recipe, steps=3)
    with tempfile.TemporaryDirectory() as work, two_hosts(Path(work)) as hosts:
        shape(hosts, None)
        gbits = ["--links", args.links]
        bare = {"hvd_train": bench(hosts, args.recipe, args.steps, gbits),
                "hvd_train_no_overlap": bench(hosts, args.recipe, args.steps,
                                              [*gbits, "--set", "overlap=false"])}  # fmt: skip
        for _ in range(args.repeats):  # interleaved, so that slow spells hit every link
            for gbit in links:
                shape(hosts, gbit)
                rounds[gbit].append(round_of(hosts, args.recipe, args.steps))
        shape(hosts, None)
    figures = {"recipe": args.recipe, "gradient_mb": bare["hvd_train"]["gradient_mb"],
               "machine": machine(), "repeats": args.repeats, "steps": args.steps,
               "links": [summary(gbit, rounds[gbit], bare) for gbit in links],
               "copied_mb_per_step": copied,
               "bare_link": bare,
               "rounds": {f"{gbit:g}": rounds[gbit] for gbit in links}}  # fmt: skip
    print(json.dumps(figures, indent=2) if args.json else table(figures))
    if args.chart:
        chart(figures, args.chart)


if __name__ == "__main__":
    main()
