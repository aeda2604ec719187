"""Command line: `hvd-train [train|launch|eval|export|show-recipe|plot|bench|doctor|k8s] ...`, the
same as `python -m hvd_train ...`; `train` is the default command."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from hvd_train.errors import (
    DataStalled,
    ReplicasDiverged,
    Stopped,
    UsageError,
    report,
    reported_here,
)
from hvd_train.frameworks import DEFAULT_FRAMEWORK, EXPORT_FORMATS, FRAMEWORKS
from hvd_train.launching import BACKENDS
from hvd_train.recipe.rules import Rule
from hvd_train.training.options import TRAIN_OPTIONS, add_arguments
from hvd_train.version import __version__


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        line = f"hvd-train: error: {message}; see `hvd-train --help`\n"
        self.exit(2, line if reported_here(UsageError(message)) else None)


def positive(kind: type) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a positive {kind.__name__}, got {text!r}"
            ) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse


def checked(rule: Rule) -> Callable[[str], Any]:
    """An argparse type for a `RunOptions` field: its rule, on the flag's text as a number."""

    def parse(text: str) -> Any:
        if rule.positive:
            return positive(rule.kind)(text)
        try:
            return rule.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {rule.kind.__name__}, got {text!r}"
            ) from None

    return parse


def gbit_list(text: str) -> list[float]:
    """Comma-separated positive link speeds in Gbit/s."""
    number = positive(float)
    return [float(number(part)) for part in text.split(",")]


def setting(text: str) -> tuple[str, Any]:
    """`section.key=value` from --set; the value is read as TOML (`2`, `0.5`, `true`,
    `[28, 28, 1]`), or taken as a string when it is not TOML (`sgd`)."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"expected section.key=value, got {text!r}")
    try:
        return key.strip(), tomllib.loads(f"value = {value}")["value"]
    except tomllib.TOMLDecodeError:
        return key.strip(), value


def build_parser() -> argparse.ArgumentParser:
    frameworks = " or ".join(framework.display for framework in FRAMEWORKS.values())
    parser = Parser(
        prog="hvd-train",
        description=f"Data-parallel training with Horovod from one recipe, under {frameworks}. "
        "Run alone, or under `horovodrun -np N` for N processes.",
    )
    parser.add_argument("--version", action="version", version=f"hvd_train {__version__}")
    recipe = Parser(add_help=False)
    recipe.add_argument(
        "--recipe",
        help="a packaged recipe by name, a recipe file (.toml, or .py defining `recipe`; "
        "file.py:NAME for another name), or package.module:NAME (default: mnist_cnn; with "
        "--resume, the run's own)",
    )
    recipe.add_argument(
        "--set",
        dest="settings",
        type=setting,
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any recipe setting, checked as the recipe file is (repeatable), e.g. "
        "--set optimizer.weight_decay=1e-4",
    )
    recipe.add_argument("--epochs", type=positive(int), help="override the recipe's epochs")
    recipe.add_argument(
        "--batch-size",
        type=positive(int),
        help="override the recipe's per-rank batch size (the global batch is this x world size)",
    )
    recipe.add_argument(
        "--lr",
        type=positive(float),
        help="override the recipe's one-process learning rate (scaled with the world size); "
        "the same as --set optimizer.learning_rate=LR",
    )
    shared = Parser(add_help=False)
    shared.add_argument(
        "--framework",
        choices=sorted(FRAMEWORKS),
        help=f"the framework to run under (default: {DEFAULT_FRAMEWORK}; with --resume, the "
        "run's own)",
    )
    add_arguments(shared, ["data_dir"], checked)
    shared.add_argument("--debug", action="store_true", help="show tracebacks for usage errors")
    commands = parser.add_subparsers(
        dest="command",
        metavar="{train,launch,eval,export,show-recipe,write-records,plot,bench,doctor,k8s}",
        parser_class=Parser,
    )  # fmt: skip
    train = commands.add_parser(
        "train", parents=[shared, recipe], help="train a recipe (the default command)"
    )
    add_arguments(train, [name for name in TRAIN_OPTIONS if name != "data_dir"], checked)
    launch = commands.add_parser(
        "launch", parents=[shared, recipe],
        help="start the ranks from here (Horovod's launcher, or Ray actors) and train in each",
    )  # fmt: skip
    launch.add_argument("-np", "--np", type=positive(int), default=2,
                        help="the number of ranks (default: %(default)s)")  # fmt: skip
    launch.add_argument("--backend", choices=BACKENDS, default="horovod",
                        help="horovod: Horovod's launcher, on Gloo; ray: Ray actors, through "
                        "Horovod's RayExecutor (default: %(default)s)")  # fmt: skip
    launch.add_argument("-H", "--hosts", help="with --backend horovod: the hosts, as "
                        "horovodrun -H takes them (a:2,b:2; default: this machine)")  # fmt: skip
    launch.add_argument("--address", help="with --backend ray: the Ray cluster to join "
                        "(default: start a local one for the job)")  # fmt: skip
    add_arguments(launch, [name for name in TRAIN_OPTIONS if name != "data_dir"], checked)
    evaluate = commands.add_parser(
        "eval", parents=[shared], help="evaluate a checkpoint written by either framework"
    )
    evaluate.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="a checkpoint (runs/.../checkpoints/epoch-...) or a run directory (its newest)",
    )
    evaluate.add_argument(
        "--recipe",
        help="for a Python recipe's checkpoint: the recipe, if it moved since (default: where "
        "the checkpoint says it was)",
    )
    evaluate.add_argument(
        "--json", action="store_true", help="print one JSON object instead of a sentence"
    )
    formats = {name: text for f in FRAMEWORKS.values() for name, (_, text) in f.exports.items()}
    export = commands.add_parser(
        "export", parents=[shared], help="write a checkpoint's model for serving, without "
        f"hvd_train: {', '.join(formats.values())}",
    )  # fmt: skip
    export.add_argument("checkpoint", type=Path, metavar="CHECKPOINT",
                        help="a checkpoint, or a run directory (its newest)")  # fmt: skip
    export.add_argument(
        "--format",
        required=True,
        choices=EXPORT_FORMATS,
        help="; ".join(f"{name}: {text}" for name, text in formats.items()),
    )
    export.add_argument("-o", "--output", type=Path, help="where to write it (default: the "
                        "run's export/ folder, with the format's suffix)")  # fmt: skip
    export.add_argument("--recipe", help="for a Python recipe's checkpoint: the recipe, if it "
                        "moved since")  # fmt: skip
    commands.add_parser(
        "show-recipe",
        parents=[shared, recipe],
        help="print the effective recipe (after --set) as TOML, with its hash",
    )
    records = commands.add_parser(
        "write-records", parents=[shared, recipe],
        help='write the recipe\'s data as ArrayRecord files, for dataset = "records"',
    )  # fmt: skip
    records.add_argument("out", type=Path, metavar="OUT", help="the folder to write the record "
                         "files into")  # fmt: skip
    records.add_argument("--records-per-file", type=positive(int), default=10_000,
                         help="examples per file (default: %(default)s)")  # fmt: skip
    doctor = commands.add_parser(
        "doctor", parents=[shared], help="check what a run needs, here and on other hosts"
    )
    doctor.add_argument(
        "-H", "--hosts", help="also check these hosts, as horovodrun -H takes them (a:4,b:4)"
    )
    doctor.add_argument(
        "--ssh-identity-file",
        type=Path,
        help="the private key to reach the hosts with, as horovodrun's option of that name",
    )
    bench = commands.add_parser(
        "bench", parents=[shared, recipe],
        help="time the recipe's training steps: images/s, T_comp, T_sync, scaling efficiency",
    )  # fmt: skip
    bench.add_argument("--steps", type=positive(int), default=100, help="steps timed in each "
                       "phase (default: %(default)s)")  # fmt: skip
    bench.add_argument("--warmup", type=positive(int), default=10, help="untimed steps before "
                       "each phase (default: %(default)s)")  # fmt: skip
    bench.add_argument("--synthetic", action="store_true", help="synthetic data of the recipe's "
                       "shape instead of its own (no files needed)")  # fmt: skip
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--links", type=gbit_list, default=[], metavar="GBITS",
                       help="also project the scaling efficiency at 2 to 64 hosts on links of "
                       "these Gbit/s, as 10,1,0.1; needs 2 or more ranks")  # fmt: skip
    plot = commands.add_parser(
        "plot", help="draw the loss, metric and learning-rate curves of runs side by side"
    )
    plot.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="a run's --output-dir")
    plot.add_argument(
        "-o", "--output", type=Path, default=Path("curves.png"),
        help="the PNG to write (default: %(default)s)",
    )  # fmt: skip
    plot.add_argument("--debug", action="store_true", help="show tracebacks for usage errors")
    k8s = commands.add_parser(
        "k8s", help="print a Kubeflow MPIJob that trains across worker pods (kubectl apply -f)"
    )
    k8s.add_argument("--image", required=True, help="the image, built from docker/Dockerfile.*")
    k8s.add_argument("-np", "--np", type=positive(int), default=2, help="the number of ranks "
                     "(default: %(default)s)")  # fmt: skip
    k8s.add_argument("--slots-per-worker", type=positive(int), default=1, help="ranks per "
                     "worker pod (default: %(default)s)")  # fmt: skip
    k8s.add_argument("--name", default="hvd-train", help="the job's name (default: %(default)s)")
    k8s.add_argument("--cpu", default="2", help="each worker's CPUs (default: %(default)s)")
    k8s.add_argument("--memory", default="4Gi", help="each worker's memory (default: "
                     "%(default)s)")  # fmt: skip
    k8s.add_argument("train_arguments", nargs="*", metavar="-- TRAIN_FLAGS", help="the flags of "
                     "`hvd-train train` for the job (default: --recipe mnist_cnn --framework "
                     f"{DEFAULT_FRAMEWORK})")  # fmt: skip
    k8s.add_argument("--debug", action="store_true", help="show tracebacks for usage errors")
    return parser


def run_doctor(args: argparse.Namespace) -> int:
    from hvd_train.commands.doctor import run_doctor as check

    checks = check(args.data_dir, args.hosts, args.ssh_identity_file)
    for item in checks:
        print(item.line())
    failed = [item for item in checks if not item.ok]
    print(f"{len(failed)} of {len(checks)} checks failed" if failed else "all checks passed")
    return 1 if failed else 0


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """--set's settings, then the shorthand flags, which win."""
    flags = {"schedule.epochs": args.epochs, "schedule.batch_size": args.batch_size,
             "optimizer.learning_rate": args.lr}  # fmt: skip
    return dict(args.settings) | {key: value for key, value in flags.items() if value is not None}


def run_train(args: argparse.Namespace) -> int:
    from hvd_train.api import train

    train(args.recipe, args.framework, **{name: getattr(args, name) for name in TRAIN_OPTIONS},
          **overrides(args))  # fmt: skip
    return 0


def run_launch(args: argparse.Namespace) -> int:
    from hvd_train.launching import launch
    from hvd_train.recipe.scoring import describe, evaluation_figures

    summary = launch(args.recipe, args.np, args.framework, backend=args.backend,
                     hosts=args.hosts, address=args.address,
                     **{name: getattr(args, name) for name in TRAIN_OPTIONS},
                     **overrides(args))  # fmt: skip
    print(
        f"hvd-train launch: {summary['recipe']} under {summary['framework']} on "
        f"{summary['world_size']} ranks ({args.backend}): {describe(evaluation_figures(summary))} "
        f"after {summary['train_seconds']:.1f} s of training"
    )
    return 0


def run_show_recipe(args: argparse.Namespace) -> int:
    from hvd_train.api import DEFAULT_RECIPE, resolve_recipe, with_overrides
    from hvd_train.recipe.toml import recipe_toml

    framework = args.framework or DEFAULT_FRAMEWORK
    recipe = resolve_recipe(args.recipe or DEFAULT_RECIPE, framework)
    recipe = with_overrides(recipe, overrides(args))
    print(recipe_toml(recipe), end="")
    return 0


def run_write_records(args: argparse.Namespace) -> int:
    from hvd_train.api import DEFAULT_RECIPE, resolve_recipe, with_overrides
    from hvd_train.data.records import write_records
    from hvd_train.recipe import load_source

    recipe = resolve_recipe(args.recipe or DEFAULT_RECIPE, args.framework or DEFAULT_FRAMEWORK)
    recipe = with_overrides(recipe, overrides(args))
    try:
        written = write_records(load_source(recipe, args.data_dir), args.out, args.records_per_file)
    except OSError as error:
        raise UsageError(f"cannot write the record files into {args.out} ({error.strerror}); free "
                         "space there or choose another folder") from None  # fmt: skip
    print(f"wrote {len(written)} record files into {args.out}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from hvd_train.commands.evaluate import evaluate_checkpoint
    from hvd_train.recipe.scoring import describe, evaluation_figures

    framework = args.framework or DEFAULT_FRAMEWORK
    result = evaluate_checkpoint(args.checkpoint, framework, args.data_dir, args.recipe)
    if result is None:  # not rank 0
        return 0
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['checkpoint']} ({result['written_by']}) under {result['framework']}: "
            f"{describe(evaluation_figures(result))}"
        )
    return 0


def run_export(args: argparse.Namespace) -> int:
    from hvd_train.commands.export import export_checkpoint

    result = export_checkpoint(args.checkpoint, args.format, args.output, args.data_dir,
                               args.recipe)  # fmt: skip
    checked = (
        f"loaded back, its outputs on {result['examples_checked']} test examples are within "
        f"{result['max_difference']:.1e} of the model's"
        if result["max_difference"] is not None
        else "not loaded back here (its runtime is not installed)"
    )
    print(f"wrote {result['export']} ({args.format}); {checked}")
    return 0


def run_bench(args: argparse.Namespace) -> int:
    from hvd_train.commands.bench import run_bench as bench
    from hvd_train.commands.bench import table

    framework = args.framework or DEFAULT_FRAMEWORK
    figures = bench(args.recipe, framework, overrides(args), args.steps, args.warmup,
                    args.synthetic, args.data_dir, args.links)  # fmt: skip
    if figures is None:  # not rank 0
        return 0
    title = (f"hvd-train bench: {figures['recipe']} under {framework}, {figures['world_size']} "
             f"rank(s) x {figures['threads_per_rank']} thread(s), global batch "
             f"{figures['global_batch']}, {args.steps} steps")  # fmt: skip
    print(json.dumps(figures) if args.json else table(figures, title))
    return 0


def run_k8s(args: argparse.Namespace) -> int:
    from hvd_train.commands.k8s import DEFAULT_TRAIN_ARGUMENTS, mpijob, render

    train_arguments = tuple(args.train_arguments) or DEFAULT_TRAIN_ARGUMENTS
    manifest = mpijob(args.image, args.np, args.slots_per_worker, train_arguments, args.name,
                      args.cpu, args.memory)  # fmt: skip
    print(render(manifest), end="")
    return 0


def run_plot(args: argparse.Namespace) -> int:
    from hvd_train.training.plot import plot_runs

    plot_runs(args.runs, args.output)
    print(f"wrote {args.output}")
    return 0


# Seconds a rank that lost contact with a peer waits before it exits; see main().
LOST_PEER_GRACE_S = 10

COMMANDS = {
    "train": run_train,
    "launch": run_launch,
    "eval": run_eval,
    "export": run_export,
    "doctor": run_doctor,
    "show-recipe": run_show_recipe,
    "write-records": run_write_records,
    "plot": run_plot,
    "bench": run_bench,
    "k8s": run_k8s,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help", "--version"):
        argv.insert(0, "train")
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as error:
        if args.debug:
            raise
        report(error)
        if isinstance(error, DataStalled):
            sys.stderr.flush()
            os._exit(2)  # not waiting for the hung reader threads (errors.DataStalled)
        return 2
    except Stopped as stop:  # rank 0 said where it stopped and how to resume
        return 128 + stop.signum
    except ReplicasDiverged as error:
        report(error)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C, or one before training began
        print("hvd-train: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if failed_job(error):  # `launch`: a rank died, or raised what cannot be rebuilt here
            failure: Any = error
            if failure.remote_traceback:
                print(failure.remote_traceback, file=sys.stderr)
            print(f"hvd-train: error: {failure.summary()}; the job was stopped", file=sys.stderr)
            return 1
        if not lost_peer(error):
            raise
        print(
            "hvd-train: error: lost contact with another rank, which most likely died (horovodrun "
            f"names the first process that failed); {type(error).__name__}: "
            f"{str(error).splitlines()[0]}",
            file=sys.stderr,
        )
        # horovodrun ends the job with the exit code of the first process to exit. The rank that
        # failed is often still shutting down, so this one leaves it the time to exit first
        # (horovodrun stops this one then); otherwise a bad image's exit 2 would read as 1.
        time.sleep(LOST_PEER_GRACE_S)
        return 1


def failed_job(error: Exception) -> bool:
    """Whether `error` is the patched Horovod launcher's JobFailed: a rank of a job that `launch`
    started died, or raised an exception that cannot be rebuilt in the caller."""
    exceptions = sys.modules.get("horovod.common.exceptions")
    job_failed = getattr(exceptions, "JobFailed", None)
    return job_failed is not None and isinstance(error, job_failed)


def lost_peer(error: Exception) -> bool:
    """Whether `error` is Horovod reporting that a collective failed because a peer is gone:
    torch raises HorovodInternalError; TensorFlow, an op error with Horovod's shutdown message."""
    exceptions = sys.modules.get("horovod.common.exceptions")
    if exceptions is not None and isinstance(error, exceptions.HorovodInternalError):
        return True
    return "Horovod has been shut down" in str(error)
