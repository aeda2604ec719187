"""Writes the figures on the README and the docs pages from the results files the benchmarks
write (docs/results/*.json), so that a page holds no figure of its own: each figure sits in a
block, `<!-- results NAME -->` ... `<!-- /results -->`, which RENDERERS[NAME] fills from the
files, with their date and machine.

    python -m benchmarks.render          # rewrite every page's blocks from the files
    python -m benchmarks.render --check  # exit 1 naming each block that differs (make test)

Which benchmark writes which file: docs/performance.md, "What to run".
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
BLOCK = re.compile(r"(<!-- results (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def results(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


def when(figures: dict[str, Any]) -> str:
    """The date and machine a results file was measured on, as its `machine` says."""
    date, machine = figures["machine"].split(", ", 1)
    return f"{date}, on {machine}"


def day(figures: dict[str, Any]) -> str:
    """The date alone."""
    return str(figures["machine"].split(", ", 1)[0])


def first_run() -> str:
    """The README's excerpt of `make train`'s output under torch: a progress line and the
    evaluation line of each epoch."""
    figures = results("default-run")
    run = figures["runs"]["torch"]
    lines = run["lines"]
    epochs = [line for line in lines if ": train loss " in line]
    shown: list[str] = []
    for evaluation in epochs:
        epoch = evaluation.split(":epoch ", 1)[1].split(":", 1)[0]
        steps = [line for line in lines if f":epoch {epoch}: step " in line]
        shown += ["...", steps[len(steps) // 2], "...", evaluation]
    summary = run["summary"]
    return "\n".join([
        "```text", *shown, "```", "",
        f"({day(figures)}, on the machine [Results](#results) names for "
        "`docs/results/default-run.json`: "
        f"{summary['test_accuracy']:.2%} after {summary['train_seconds']:.1f} s of training, "
        f"{run['wall_seconds']:.0f} s in all.)", "",
    ])  # fmt: skip


def default_run() -> str:
    """Both frameworks' default runs, one row each."""
    figures = results("default-run")
    command = figures["runs"]["torch"]["command"]
    head = ["framework", "test accuracy", "test loss", "train_seconds", "images/s", "step_ms",
            "t_comp_ms", "t_sync_ms"]  # fmt: skip
    rows = []
    for framework, run in figures["runs"].items():
        s = run["summary"]
        timings = [f"{s[key]:.1f}" for key in ("step_ms", "t_comp_ms", "t_sync_ms")]
        quality = [f"{s['test_accuracy']:.2%}", f"{s['test_loss']:.4f}"]
        speed = [f"{s['train_seconds']:.1f}", f"{s['images_per_second']:.0f}", *timings]
        rows.append([framework, *quality, *speed])
    return "\n".join([
        f"`{command}`, and the same with `--framework tensorflow`, with the recipe's defaults "
        "(2 epochs, global batch 128), on Gloo, "
        f"{when(figures)} (`docs/results/default-run.json`):", "", table(head, rows), "",
    ])  # fmt: skip


def default_run_accuracy() -> str:
    figures = results("default-run")
    runs = figures["runs"]
    return (
        f"(`mnist_cnn` with its defaults under each framework, `horovodrun -np 2`, "
        f"{day(figures)}: "
        f"{runs['torch']['summary']['test_accuracy']:.2%} under torch, "
        f"{runs['tensorflow']['summary']['test_accuracy']:.2%} under TensorFlow.)\n"
    )


def links_row(figures: dict[str, Any], gbit_s: float) -> dict[str, Any]:
    return next(row for row in figures["links"] if row["gbit_s"] == gbit_s)


def resnet18_summary() -> str:
    """The README's sentence on ResNet-18 across two hosts."""
    figures = results("links-resnet18")
    slow, fast = links_row(figures, 1.0), links_row(figures, 10.0)
    return (
        f"ResNet-18 (`--recipe resnet18`, {figures['gradient_mb']:.0f} MB of gradients a step) "
        f"across two hosts, best of {figures['repeats']} rounds, {day(figures)}: "
        f"at 1 Gbit/s {slow['hvd_train']:.1f} images/s with the exchange overlapping the "
        f"backward pass, {slow['of_limit']['hvd_train']:.2f} of the same ranks with no exchange "
        f"at all, against {slow['ddp']:.1f} for torch's DDP "
        f"({slow['hvd_train'] / slow['ddp']:.2f}x); at 10 Gbit/s {fast['hvd_train']:.1f} against "
        f"{fast['ddp']:.1f} ({fast['hvd_train'] / fast['ddp']:.2f}x).\n"
    )


def resnet18_links() -> str:
    """docs/performance.md's table: each system at each link speed."""
    figures = results("links-resnet18")
    head = ["link", "hvd_train torch (auto)", "overlap off", "torch DDP", "hvd_train TF",
            "limit", "torch / DDP", "within a round", "hvd_train bf16", "DDP bf16",
            "bf16 / DDP bf16"]  # fmt: skip
    rows = [[f"{row['gbit_s']:g} Gbit/s", f"{row['hvd_train']:.1f}",
             f"{row['hvd_train_no_overlap']:.1f}", f"{row['ddp']:.1f}",
             f"{row['tensorflow']:.1f}", f"{row['limit']:.1f}",
             f"{row['hvd_train'] / row['ddp']:.2f}x", f"{row['hvd_train_vs_ddp']:.2f}x",
             f"{row['hvd_train_bf16']:.1f}", f"{row['ddp_bf16']:.1f}",
             f"{row['bf16_vs_ddp_bf16']:.2f}x"]
            for row in figures["links"]]  # fmt: skip
    return "\n".join([
        f"Images/s, best of {figures['repeats']} rounds of {figures['steps']} steps, "
        f"{when(figures)} (`docs/results/links-resnet18.json`). \"torch / DDP\" divides the "
        "best of each; \"within a round\" and \"bf16 / DDP bf16\" are the best ratio of two runs "
        "of one round. bf16: gradients sent as bf16 (`[horovod] compression = \"bf16\"`; DDP "
        "with torch's bf16_compress_hook):", "",
        table(head, rows), "", *links_checks(figures),
    ])  # fmt: skip


def links_checks(figures: dict[str, Any]) -> list[str]:
    """Under the table: "auto" against the faster of overlap on and off in each round, and each
    system's share of its own limit (hvd_train's local phase; DDP's steps under no_sync)."""
    lines = []
    for row in figures["links"]:
        rounds = figures["rounds"][f"{row['gbit_s']:g}"]
        chosen = ", ".join("on" if r["overlapped"] else "off" for r in rounds)
        faster = ", ".join("on" if r["overlap_on"] >= r["hvd_train_no_overlap"] else "off"
                           for r in rounds)  # fmt: skip
        auto = ", ".join(f"{share:.2f}" for share in row["auto_vs_best"])
        picked = ", ".join(f"{share:.2f}" for share in row["chosen_vs_best"])
        ours = row["of_limit"]["hvd_train"]
        lines.append(
            f'- {row["gbit_s"]:g} Gbit/s: "auto" chose overlap {chosen}; the faster of overlap on '
            f"and off was {faster}; the chosen setting's run over the faster, each round: "
            f"{picked} (auto's own run: {auto}). Of their own limits: "
            f"hvd_train torch {ours:.2f} ({row['limit']:.1f}), DDP "
            f"{row['ddp_of_own_limit']:.2f} ({row['ddp_limit']:.1f})."
        )
    return [*lines, ""]


def resnet18_copies() -> str:
    """docs/performance.md's table: the MB each system copies in a ResNet-18 step."""
    figures = results("links-resnet18")
    copied = figures["copied_mb_per_step"]
    names = {"plain": "plain loop, one process", "hvd_train_no_overlap": "hvd_train, overlap off",
             "hvd_train": "hvd_train, overlap on", "hvd_train_bf16": "hvd_train bf16",
             "ddp": "torch DDP", "ddp_bf16": "torch DDP, bf16 hook"}  # fmt: skip
    rows = [[label, f"{copied[name]['torch_mb']:.1f}", f"{copied[name]['horovod_mb']:.1f}",
             f"{copied[name]['total_mb']:.1f}", f"{copied[name]['exchange_mb']:+.1f}"]
            for name, label in names.items()]  # fmt: skip
    head = ["system", "torch", "Horovod", "in all", "over the plain loop"]
    return "\n".join([
        f"MB a step, ResNet-18 ({copied['gradient_mb']:.1f} MB of gradients), {when(figures)} "
        "(`docs/results/links-resnet18.json`):", "", table(head, rows), "",
    ])  # fmt: skip


def tf_flat() -> str:
    """docs/performance.md's sentence on a flat buffer under TensorFlow."""
    figures = results("tf-flat")
    return (
        f"grouped {figures['grouped_ms']:.1f} ms, flat {figures['flat_ms']:.1f} ms: the flat "
        f"buffer takes {figures['flat_over_grouped']:.2f}x as long ({when(figures)}, "
        "`docs/results/tf-flat.json`).\n"
    )


def precision() -> str:
    figures = results("precision")
    spans = []
    for recipe in dict.fromkeys(row["recipe"] for row in figures["rows"]):
        ratios = [row["over_fp32"]["bf16-mixed"] for row in figures["rows"]
                  if row["recipe"] == recipe]  # fmt: skip
        spans.append(f"{recipe} {min(ratios):.2f}-{max(ratios):.2f}x")
    return (
        f"`bf16-mixed` over fp32, images/s, under both frameworks at np=1 and 2 "
        f"({when(figures)}; `docs/results/precision.json`): {', '.join(spans)}.\n"
    )


def systems_mnist() -> str:
    figures = results("systems-mnist")
    best = figures["best"]
    torch, ddp = best["hvd_train torch, np=2"], best["torch DDP (Gloo, torchrun), np=2"]
    tf = best["hvd_train tensorflow, np=2"]
    mwms = best["TensorFlow MultiWorkerMirroredStrategy (custom loop), 2 workers"]
    return (
        f"`mnist_cnn` at np=2 on one host, images/s ({when(figures)}; "
        f"`docs/results/systems-mnist.json`): hvd_train torch {torch:.0f} against torch's DDP "
        f"{ddp:.0f} ({torch / ddp:.2f}x); hvd_train TensorFlow {tf:.0f} against "
        f"MultiWorkerMirroredStrategy {mwms:.0f} ({tf / mwms:.2f}x).\n"
    )


def own_loop() -> str:
    """docs/performance.md's table: a loop of one's own against the trainer, raw Horovod and
    DDP, each ratio within a round, the best round's, against its target."""
    figures = results("own-loop")
    rows = [
        (framework, name, value, figures["targets"].get(name))
        for framework, ratios in figures["best"].items()
        for name, value in ratios.items()
    ]
    return "\n".join([
        f"np=2, best of {len(figures['rounds']['torch'])} rounds of {figures['steps']} steps "
        f"({when(figures)}; `docs/results/own-loop.json`):",
        "",
        "| framework | ratio of images/s, within a round | best | target |",
        "|---|---|---|---|",
        *(f"| {framework} | {name.replace('_', ' ')} | {value:.2f} | "
          f"{'' if target is None else f'>= {target:.2f}'} |"
          for framework, name, value, target in rows),
    ]) + "\n"  # fmt: skip


def passed(run: dict[str, Any]) -> str:
    """How many tests a run passed, from pytest's closing line."""
    return str(run["counts"].split(" passed")[0])


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes"


def test_times_summary() -> str:
    """The README's sentence on what the two test commands cost."""
    figures = results("test-times")
    test, quick = figures["test"], figures["quick"]
    return (
        f"`make test` passed {passed(test)} tests in {minutes(test['seconds'])} of pytest on 2 "
        f"cores ({day(figures)}; set-up adds a few minutes once the Horovod wheel is cached), "
        f"Horovod's own test suites included; `make test-quick` (unit tests and one short "
        f"two-rank run per framework) {passed(quick)} in {minutes(quick['seconds'])}.\n"
    )


def test_times() -> str:
    """docs/testing.md's table of the slowest tests."""
    figures = results("test-times")
    test = figures["test"]
    rows = [[f"`{entry['test'].split('/', 1)[1]}`", f"{entry['seconds']:.0f}"]
            for entry in test["slowest"][:12]]  # fmt: skip
    slowest = sum(entry["seconds"] for entry in test["slowest"])
    return "\n".join([
        f"`make test`, {when(figures)} (`docs/results/test-times.json`): {passed(test)} tests in "
        f"{minutes(test['seconds'])} of pytest (pytest-xdist: the one-process tests beside the "
        f"multi-process ones); its 25 slowest tests took {minutes(slowest)} together, the 12 "
        "slowest:", "",
        table(["test", "seconds"], rows), "",
    ])  # fmt: skip


def data() -> str:
    """docs/data.md's tables: a slow source with and without the workers; PNG files."""
    figures = results("data")
    waiting = [[row["framework"], *(f"{row[name]['images_per_second']:.0f} "
                                    f"({row[name]['t_data_ms']:.1f} ms)" for name in
                                    ("in memory", "waiting, read in the step",
                                     "waiting, workers auto")),
                f"{row['hidden']:.2f}"] for row in figures["rows"]]  # fmt: skip
    decoding = [[row["framework"], str(row["processes"]),
                 *(f"{row[name]['images_per_second']:.0f}"
                   + (f", {100 * row[name]['test_accuracy']:.2f}%" if row["processes"] == 2 else "")
                   for name in ("in memory", "png files")),
                 f"{row['over_memory']:.2f}"] for row in figures["decoding"]]  # fmt: skip
    return "\n".join([
        f"`python -m benchmarks.data`, mnist_cnn at np=2, best of {figures['repeats']} "
        f"({when(figures)}; `docs/results/data.json`). One epoch of {figures['examples']:,} "
        f"examples, images/s (T_data), in memory and behind a source whose every read waits "
        f"{figures['wait_ms']:g} ms:", "",
        table(["framework", "in memory", "waiting, read in the step", "waiting, workers auto",
               "auto over memory"], waiting), "",
        "The whole recipe (2 epochs) from MNIST's 70,000 PNG files (decoded by the workers) and "
        "from MNIST in memory, images/s and test accuracy; at np=1, one epoch of each (one rank, "
        "its passes on both cores):", "",
        table(["framework", "np", "in memory", "PNG files", "PNG over memory"], decoding), "",
    ])  # fmt: skip


def loaders() -> str:
    """docs/data.md's table: the input pipelines hvd_train could be built on, side by side."""
    figures = results("loaders")
    names = list(figures["rows"][0]["over_hvd_train"])
    rows = [[row["source"], *(f"{row[name]['batches_per_second']:.0f} "
                              f"({row[name]['start_s']:.1f} s)" for name in ["hvd_train", *names]),
             *(f"{row['over_hvd_train'][name]:.2f}" for name in names)]
            for row in figures["rows"]]  # fmt: skip
    return "\n".join([
        f"`python -m benchmarks.loaders`, best of {figures['repeats']} ({when(figures)}; "
        f"`docs/results/loaders.json`). Batches of {figures['batch']} read by "
        f"{figures['workers']} workers, {figures['batches']} of them, while the main thread only "
        "takes them: batches/s after the first (the seconds to the first: the loader's start):",
        "", table(["source", "hvd_train (Grain, threads)", *names,
                   *(f"{name} over hvd_train" for name in names)], rows), "",
    ])  # fmt: skip


def memory() -> str:
    """docs/data.md's table: peak memory per rank with a large set on disk and a small one."""
    figures = results("memory")
    rows = [[row["source"], *(f"{row[size][0]} MB ({row[size][1]} MB)"
                              for size in ("small_mb", "large_mb")),
             f"{row['own_growth_mb']:+} MB"] for row in figures["rows"]]  # fmt: skip
    return "\n".join([
        f"`python -m benchmarks.memory`, mnist_cnn under torch at np=2, {figures['steps']} steps "
        f"({when(figures)}; `docs/results/memory.json`). The largest resident memory of either "
        "rank (in brackets, its own: less the file pages it maps):", "",
        table(["training set on disk", f"{figures['small_gb'] * 1000:g} MB set",
               f"{figures['large_gb']:g} GB set", "growth of its own"], rows), "",
    ])  # fmt: skip


def sharding_memory() -> str:
    """docs/sharding.md's table: each rank's training state and peak memory per shard setting."""
    figures = results("sharding-memory")
    rows = []
    for row in figures["rows"]:
        held = [round(row["held_bytes"][0][key] / 2**20)
                for key in ("weights", "gradients", "optimizer")]  # fmt: skip
        rows.append([row["framework"], str(row["ranks"]), f'`"{row["shard"]}"`',
                     " / ".join(map(str, held)),
                     ", ".join(map(str, row["peak_training_mb"])),
                     ", ".join(map(str, row["lowered_mb"])), str(row["target_mb"]),
                     ", ".join(map(str, row["peak_saving_mb"])),
                     "yes" if row["met"] else "**no**"])  # fmt: skip
    parameters = figures["rows"][0]["parameters"]
    return "\n".join([
        f"`python -m benchmarks.memory state` ({when(figures)}; "
        "`docs/results/sharding-memory.json`): a model of "
        f"{parameters / 1e6:.1f} M parameters under AdamW, three steps then a checkpoint, under "
        "each framework at each world size and shard setting. Held: rank 0's weights (under "
        "TensorFlow with its copies of its runs of the parameters it splits, if any), "
        "gradients and optimizer state (MB); the "
        "peak resident memory of each rank after the steps and after saving (MB); "
        "how far the peak fell against `\"none\"`, and the target (0.8 x (1 - 1/N) x the "
        "bytes a stage stops holding; met where every rank's fell that far and no rank's "
        "saving peak rose above the unsharded run's):", "",
        table(["framework", "ranks", "shard", "held", "peak", "lowered", "target", "peak saving",
               "met"], rows), "",
    ])  # fmt: skip


def sharding_largest() -> str:
    """docs/sharding.md's table: the largest model each setting trains within a rank's memory,
    per framework, from the bytes a parameter that the state benchmark measured."""
    figures = results("sharding-memory")
    rows, measured = [], []
    for framework in dict.fromkeys(row["framework"] for row in figures["rows"]):
        ran = {row["shard"]: row for row in figures["rows"]
               if row["framework"] == framework and row["ranks"] == 2}  # fmt: skip
        parameters = ran["none"]["parameters"]
        held = {key: ran["none"]["held_bytes"][0][key] / parameters
                for key in ("weights", "gradients", "optimizer")}  # fmt: skip
        # TensorFlow's copies of a rank's runs of split parameters: the weights a sharded rank
        # holds beyond them.
        held["copies"] = 2 * (ran["optimizer"]["held_bytes"][0]["weights"] / parameters
                              - held["weights"])  # fmt: skip
        measured.append(f"{framework}: " + ", ".join(f"{value:.2f} {key}"
                                                    for key, value in held.items()))  # fmt: skip
        for shard in ("none", "optimizer", "gradients"):
            needs = [_bytes_per_parameter(held, shard, n) for n in (8, 64)]
            rows.append([framework, f'`"{shard}"`', *(f"{value:.2f}" for value in needs),
                         *(f"{memory * 2**30 / value / 1e9:.1f} B"
                           for memory in (24, 80) for value in needs)])  # fmt: skip
    return "\n".join([
        "From the bytes a parameter that `python -m benchmarks.memory state` measured at two "
        f"ranks ({'; '.join(measured)}; under AdamW in fp32; `docs/results/sharding-memory.json`),"
        " the bytes a parameter each rank holds, and the largest model whose "
        "training state fits in a rank's memory, at 8 and 64 ranks (activations, the "
        "framework's own memory and the exchange's buffers left out):", "",
        table(["framework", "shard", "bytes/param, 8 ranks", "64 ranks", "24 GiB, 8 ranks",
               "24 GiB, 64", "80 GiB, 8", "80 GiB, 64"], rows), "",
    ])  # fmt: skip


def _bytes_per_parameter(held: dict[str, float], shard: str, ranks: int) -> float:
    """What a rank holds a parameter under `shard` at `ranks`, from the unsharded bytes `held`
    (weights, gradients, optimizer) and the sharded run's copies of its runs."""
    if shard == "none":
        return held["weights"] + held["gradients"] + held["optimizer"]
    gradients = held["gradients"] / (ranks if shard == "gradients" else 1)
    return held["weights"] + gradients + (held["optimizer"] + held["copies"]) / ranks


def sharding_speed() -> str:
    """docs/sharding.md's table: each stage against unsharded and torch's system, per link."""
    figures = results("links-sharding")
    rows = []
    for row in figures["links"]:
        for stage, theirs in (("optimizer", "zero"), ("gradients", "fsdp2")):
            ratios = row[stage]
            met = ratios["vs_unsharded"] >= 0.95 and ratios["vs_torch"] >= 1.0
            keras_met = ratios["tensorflow_vs_unsharded"] >= 0.95
            rows.append([f"{row['gbit_s']:g} Gbit/s", f'`"{stage}"`',
                         f"{row[f'hvd_train_{stage}']:.1f}", f"{row['hvd_train']:.1f}",
                         f"{ratios['vs_unsharded']:.2f}x", f"{theirs} {row[theirs]:.1f}",
                         f"{ratios['vs_torch']:.2f}x", "yes" if met else "**no**",
                         f"{row[f'tensorflow_{stage}']:.1f} / {row['tensorflow']:.1f}",
                         f"{ratios['tensorflow_vs_unsharded']:.2f}x",
                         "yes" if keras_met else "**no**"])  # fmt: skip
    head = ["link", "shard", "hvd_train torch", "unsharded", "within a round", "torch's system",
            "hvd_train over it", "met", "hvd_train TF / unsharded", "within a round",
            "met"]  # fmt: skip
    return "\n".join([
        f"`sudo .venv/bin/python -m benchmarks.links --sharding` ({when(figures)}; "
        "`docs/results/links-sharding.json`): ResNet-18 on two hosts of one rank each, "
        f"images/s, best of {figures['repeats']} rounds of {figures['steps']} steps; the ratios "
        "are the best of those taken within one round. Torch's system of each stage: DDP with "
        "`ZeroRedundancyOptimizer` (ZeRO-1) and FSDP2 (`fully_shard` per residual block, no "
        "reshard after forward: ZeRO-2). Targets: each stage at least 0.95x hvd_train unsharded "
        "and 1.0x torch's system (under TensorFlow, 0.95x its unsharded run: torch's systems "
        "are torch's):", "",
        table(head, rows), "",
    ])  # fmt: skip


def sharding_resnet18() -> str:
    """docs/sharding.md's table: ResNet-18 trained per stage against the unsharded run."""
    figures = results("sharding-resnet18")
    rows = []
    for row in figures["rows"]:
        summary, compared = row["summary"], row["against_unsharded"]
        if compared is None:
            against = ["(the reference)"] * 2
        else:
            against = [f"{len(c['different'])} of {c['tensors']} ({c['largest_difference']:.1g})"
                       for c in compared.values()]  # fmt: skip
        rows.append([row["framework"], f'`"{row["shard"]}"`', f"{summary['test_loss']:.2e}",
                     f"{summary['test_accuracy']:.4f}", *against])  # fmt: skip
    head = ["framework", "shard", "test loss", "test accuracy", "weights differing (largest)",
            "optimizer state differing (largest)"]  # fmt: skip
    return "\n".join([
        f"`python -m benchmarks.sharded_training --steps {figures['steps']}` ({when(figures)}; "
        f"`docs/results/sharding-{figures['recipe']}.json`): `--recipe {figures['recipe']}` "
        f"at {figures['ranks']} ranks for {figures['steps']} steps, the same seed, under each "
        "framework and stage; the tensors of each sharded run's checkpoint that are not the "
        "unsharded run's bit for bit, and the largest difference of any value (the speed of "
        "each stage is [below](#speed)):", "",
        table(head, rows), "",
    ])  # fmt: skip


def against() -> str:
    """docs/data.md's table: the default recipe in this tree against the tree before the data
    pipeline."""
    figures = results("against")
    commit = figures["against"]
    rows = [[row["framework"], *(", ".join(f"{value:.0f}" for value in row[name])
                                 for name in (commit, "this tree")),
             f"{row['over']:.2f}"] for row in figures["rows"]]  # fmt: skip
    return "\n".join([
        f"`python -m benchmarks.against {commit}`, {figures['pairs']} pairs ({when(figures)}; "
        "`docs/results/against.json`). One epoch of the default recipe (mnist_cnn, MNIST in "
        "memory) at np=2, images/s of each run, the two trees taking turns:", "",
        table(["framework", f"before the data pipeline ({commit})", "with it",
               "best over best"], rows), "",
    ])  # fmt: skip


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


RENDERERS: dict[str, Callable[[], str]] = {
    "first-run": first_run,
    "default-run": default_run,
    "default-run-accuracy": default_run_accuracy,
    "resnet18-summary": resnet18_summary,
    "resnet18-links": resnet18_links,
    "resnet18-copies": resnet18_copies,
    "tf-flat": tf_flat,
    "precision": precision,
    "systems-mnist": systems_mnist,
    "own-loop": own_loop,
    "test-times-summary": test_times_summary,
    "test-times": test_times,
    "data": data,
    "loaders": loaders,
    "memory": memory,
    "sharding-memory": sharding_memory,
    "sharding-largest": sharding_largest,
    "sharding-speed": sharding_speed,
    "sharding-resnet18": sharding_resnet18,
    "against": against,
}


def render(text: str) -> str:
    """`text` with each block's body written anew from the results files."""
    return BLOCK.sub(lambda m: m.group(1) + RENDERERS[m["name"]]() + m.group(4), text)


def stale_blocks(checked: list[Path] | None = None) -> list[str]:
    """`PAGE: NAME` for each block of the pages (all by default) whose body differs from what
    the results files give."""
    stale = []
    for page in checked or pages():
        text = page.read_text()
        fresh = {m["name"]: m["body"] for m in BLOCK.finditer(render(text))}
        stale += [f"{page.name}: {m['name']}" for m in BLOCK.finditer(text)
                  if m["body"] != fresh[m["name"]]]  # fmt: skip
    return stale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    if parser.parse_args().check:
        stale = stale_blocks()
        for block in stale:
            print(f"{block}: differs from docs/results; run python -m benchmarks.render")
        sys.exit(1 if stale else 0)
    for page in pages():
        text = page.read_text()
        if render(text) != text:
            page.write_text(render(text))
            print(f"rendered {page.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
