"""How to run a recipe (not what it trains): every option of a training run, its default and its
help, in one place. `hvd-train train`'s flags and `hvd_train.train`'s keywords are both made
from `RunOptions`, and both are checked by the same rules."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvd_train.errors import UsageError
from hvd_train.recipe.rules import Rule
from hvd_train.recipe.settings import checked_trackers

POSITIVE = Rule(int, positive=True)


def option(default: Any, help: str, *, rule: Rule | None = None, flag: str = "",
           metavar: str | None = None, choices: tuple[str, ...] = ()) -> Any:  # fmt: skip
    """A field of `RunOptions`: its default, the CLI's help (%(default)s is shown), the rule
    its values obey, and its flag where that is not the field's name. A flag with `choices`
    may be given bare, for the first."""
    meta = {"help": help, "rule": rule, "flag": flag, "metavar": metavar, "choices": choices}
    return field(default=default, metadata=meta)


# Where --resume continues from: the newest valid checkpoint, or the best one kept.
RESUME_FROM = ("latest", "best")


@dataclass(frozen=True)
class RunOptions:
    """The options of one training run. `seed` and `output_dir` left None are decided when
    the run starts: a resumed run's own, else 42 and runs/<recipe>-<framework>-<time>."""

    output_dir: Path | None = option(
        None, "where checkpoints/, metrics.jsonl and summary.json go (default: "
        "runs/<recipe>-<framework>-<time>)", metavar="DIR",
    )  # fmt: skip
    seed: int | None = option(
        None, "seed for weights and data order, the same on every rank (default: 42; with "
        "--resume, the run's own)", rule=Rule(int), metavar="N",
    )  # fmt: skip
    resume: bool | str = option(
        False, "continue the run in --output-dir from its newest valid checkpoint (latest, the "
        "default) or from its best (best: the run's later checkpoints are set aside), with the "
        "recipe, settings, seed and framework it trained with (only --epochs may grow)",
        choices=RESUME_FROM, metavar="FROM",
    )  # fmt: skip
    checkpoint_every: int | None = option(
        None, "also checkpoint every this many steps within an epoch, so a crash loses at most "
        "that many (default: only at the end of each epoch)", rule=POSITIVE, metavar="STEPS",
    )  # fmt: skip
    keep_checkpoints: int = option(
        3, "keep the newest K checkpoints, deleting older ones (default: %(default)s)",
        rule=POSITIVE, metavar="K",
    )  # fmt: skip
    elastic: bool = option(
        False, "elastic training: run under `horovodrun --min-np/--max-np "
        "--host-discovery-script`; workers may leave or join, and the job goes on (a framework "
        "without it says so; docs/elastic.md)",
    )  # fmt: skip
    commit_every: int = option(
        10, "with --elastic, commit the state every this many steps; a failure loses at most "
        "that many (default: %(default)s)", rule=POSITIVE, metavar="STEPS",
    )  # fmt: skip
    horovod_timeline: Path | None = option(
        None, "record Horovod's timeline (each collective's negotiation and transfer) into "
        "FILE, written by rank 0; open it in https://ui.perfetto.dev or chrome://tracing",
        metavar="FILE",
    )  # fmt: skip
    limit_steps: int | None = option(
        None, "train at most this many steps per epoch (quick smoke runs; default: all)",
        rule=POSITIVE, metavar="N",
    )  # fmt: skip
    log_every: int = option(
        50, "log the loss, averaged across ranks, every this many steps (default: %(default)s)",
        rule=POSITIVE, metavar="N",
    )  # fmt: skip
    track: tuple[str, ...] = option(
        (), "also send the records to a tracker, from rank 0 (repeatable): mlflow (an MLflow "
        "run at $MLFLOW_TRACKING_URI, with the recipe, the figures and the artifacts) or csv "
        "(metrics.csv in --output-dir)", metavar="NAME",
    )  # fmt: skip
    data_dir: Path | None = option(
        None, "folder holding the four MNIST files (default: $HVD_TRAIN_DATA_DIR, else the "
        "cache, filled on first use)", metavar="DIR",
    )  # fmt: skip

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            value, rule = getattr(self, item.name), item.metadata["rule"]
            if rule is not None and value is not None:
                rule.check(flag(item), value)
            if item.type == "Path | None" and value is not None:
                object.__setattr__(self, item.name, Path(value))
        object.__setattr__(self, "track", checked_trackers(self.track, "--track"))
        if self.resume is True:
            object.__setattr__(self, "resume", RESUME_FROM[0])
        if self.resume not in (False, *RESUME_FROM):
            raise UsageError(
                f"--resume: unknown value {self.resume!r}; choose {' or '.join(RESUME_FROM)}"
            )
        if self.resume and self.output_dir is None:
            raise UsageError("--resume needs --output-dir, the folder of the run to continue")
        if self.elastic and self.output_dir is None:
            raise UsageError(
                "--elastic needs --output-dir, a folder that every host sees (a shared file "
                "system), so that whichever worker is rank 0 writes to the same run"
            )

    @classmethod
    def split(cls, keywords: dict[str, Any]) -> tuple[RunOptions, dict[str, Any]]:
        """`train`'s keywords as options, and the rest (recipe overrides)."""
        names = {item.name for item in dataclasses.fields(cls)}
        given = {key: value for key, value in keywords.items() if key in names}
        return cls(**given), {k: v for k, v in keywords.items() if k not in names}


def flag(item: dataclasses.Field[Any]) -> str:
    return item.metadata["flag"] or "--" + item.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, names: list[str], parse: Any) -> None:
    """Adds the flags of `RunOptions`'s fields `names` to `parser`; `parse(rule)` makes the
    argparse type of a field with a rule (the CLI's parsers name the flag in their errors)."""
    for item in dataclasses.fields(RunOptions):
        if item.name not in names:
            continue
        meta: dict[str, Any] = {"help": item.metadata["help"], "dest": item.name}
        if item.metadata["choices"]:
            choices = item.metadata["choices"]
            meta |= {"nargs": "?", "const": choices[0], "choices": choices,
                     "default": item.default, "metavar": item.metadata["metavar"]}  # fmt: skip
        elif item.default is False:
            meta["action"] = "store_true"
        elif item.default == ():
            meta |= {"action": "append", "default": [], "metavar": item.metadata["metavar"]}
        else:
            meta["default"] = item.default
            meta["metavar"] = item.metadata["metavar"]
            if item.metadata["rule"] is not None:
                meta["type"] = parse(item.metadata["rule"])
            elif item.type == "Path | None":
                meta["type"] = Path
        parser.add_argument(flag(item), **meta)


TRAIN_OPTIONS = [item.name for item in dataclasses.fields(RunOptions)]
