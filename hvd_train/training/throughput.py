"""The speed of a run's training steps, as `summary.json`, the records and the progress show it."""

from __future__ import annotations

import numpy as np

from hvd_train.distributed import StepResult

IMAGES_PER_SECOND_BASIS = (
    "the images of every training step on all ranks, over the wall time of all those steps on "
    "rank 0 (taking the batches, forward, backward, exchange, update); evaluation, checkpoints "
    "and start-up are outside it"
)


class Throughput:
    """Images and wall time of every step, and three parts of this rank's steps: its wait for
    the batches (T_data), its passes (T_comp) and its wait for the exchange after them
    (T_sync)."""

    def __init__(self) -> None:
        self.images, self.seconds, self.steps = 0, 0.0, 0
        self.parts = np.zeros(3)
        self.recorded = (0, 0.0)  # images and seconds at the last record

    def add(self, images: int, seconds: float, result: StepResult, waited: float) -> None:
        """A step of `images` on all ranks took `seconds`, `waited` of them for its batches."""
        self.images, self.seconds, self.steps = (
            self.images + images,
            self.seconds + seconds,
            self.steps + 1,
        )
        self.parts += (waited, result.compute_seconds, result.sync_seconds)

    def since_last_record(self) -> tuple[int, float]:
        """Images and seconds of the steps since the last call."""
        images, seconds = self.images - self.recorded[0], self.seconds - self.recorded[1]
        self.recorded = (self.images, self.seconds)
        return images, seconds

    def figures(self) -> dict[str, object]:
        """The run's speed as summary.json gives it."""
        t_data, t_comp, t_sync = 1000 * self.parts / max(1, self.steps)
        return {
            "images_per_second": round(self.images / max(self.seconds, 1e-9), 1),
            "images_per_second_basis": IMAGES_PER_SECOND_BASIS,
            "step_ms": round(1000 * self.seconds / max(1, self.steps), 2),
            "t_data_ms": round(float(t_data), 2),
            "t_comp_ms": round(float(t_comp), 2),
            "t_sync_ms": round(float(t_sync), 2),
        }

    def data_share(self) -> float:
        """The share of the steps' wall time this rank waited for its batches."""
        return float(self.parts[0]) / max(self.seconds, 1e-9)
