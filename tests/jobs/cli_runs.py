"""Several `hvd-train` trainings, one after another, in one job: each a run of its own, on a
layer of its own, as if started alone; the job's start, the framework's import above all, is
paid once. Rank 0 marks where each run's output begins, on stdout and on stderr.
usage: cli_runs.py ARGUMENTS... [+ ARGUMENTS...]; a run that exits non-zero ends the job with
its code."""

import itertools
import os
import sys

from hvd_train.cli import main

runs = [list(run) for plus, run in itertools.groupby(sys.argv[1:], "+".__eq__) if not plus]
for number, arguments in enumerate(runs):
    if os.environ["HOROVOD_RANK"] == "0":
        for stream in (sys.stdout, sys.stderr):
            print(f"cli_runs.py: run {number}", file=stream, flush=True)
    if code := main(arguments):
        sys.exit(code)
