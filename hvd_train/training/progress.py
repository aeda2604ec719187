"""Progress on rank 0: a progress bar in a terminal; elsewhere (a file, a pipe, horovodrun's
prefixed output, Slurm, CI) plain lines, since a bar's carriage returns turn into fragments
there: one with each new record's figures, at most one a tenth of the epoch, and the step alone
after a minute without one."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

LINE_SECONDS = 60.0  # at most between plain lines


class EpochProgress:
    """Progress through one epoch's steps `first` .. `total`."""

    def __init__(self, label: str, first: int, total: int, enabled: bool) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(initial=first, total=total, desc=label, unit="step", leave=False,
                            mininterval=0.5)  # fmt: skip
        self.last_line, self.last_step, self.every = time.monotonic(), first, max(1, total // 10)
        self.figures = ""  # not shown yet

    def step(self, done: int) -> None:
        """Step `done` (1-based) of the epoch is finished."""
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled and (
            (self.figures and done - self.last_step >= self.every)
            or time.monotonic() - self.last_line >= LINE_SECONDS
        ):
            self.last_line, self.last_step = time.monotonic(), done
            figures, self.figures = f", {self.figures}" if self.figures else "", ""
            print(f"{self.label}: step {done}/{self.total}{figures}", file=sys.stderr, flush=True)

    def show(self, **figures: str) -> None:
        """A new record's figures (loss, learning rate, ...), shown with the progress."""
        self.figures = ", ".join(f"{name} {value}" for name, value in figures.items())
        if self.bar is not None:
            self.bar.set_postfix(figures)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
