"""Runs inside each rank under `horovodrun -np N` and allreduces, through the patched Horovod's
binding for FRAMEWORK, every dtype that binding reduces with every reduction it offers: one
tensor at a time (single), as 20 tensors that Horovod fuses into one buffer (fused), as one
group (grouped), and (torch) as 20 consecutive slices of one buffer, averaged in place in one
group, which the patched Horovod reduces where they lie (in place). Every result is allgathered
as raw bytes, so rank 0 sees what each rank got.

usage: allreduce_bits.py FRAMEWORK OUT.json
Rank 0 writes one record per case: whether all ranks got the same bytes, and whether those
equal the exact answer, where the answer is exact (see `exact_reference`); null where not.
Float16, bfloat16 and float32 sums also go through a reduce-scatter, whose result is checked
against the same exact answer.

Rank r draws its data from a generator seeded with r, so every rank can rebuild every rank's
input and the reference needs no communication.
"""

import json
import sys
import warnings
from typing import ClassVar

import ml_dtypes
import numpy as np

SUM, AVERAGE, MIN, MAX = "sum", "average", "min", "max"
# name: (op, prescale_factor, postscale_factor). Factors of 1/4 and 3 keep small sums exact in
# every float dtype; 0.1 rounds, so its cases check only that the ranks agree.
REDUCTIONS = {
    "sum": (SUM, 1.0, 1.0),
    "average": (AVERAGE, 1.0, 1.0),
    "prescale": (SUM, 0.25, 1.0),
    "postscale": (SUM, 1.0, 3.0),
    "rounding-scale": (SUM, 0.1, 1.0),
    "min": (MIN, 1.0, 1.0),
    "max": (MAX, 1.0, 1.0),
}
PIECES = 20  # tensors per fused or grouped case
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)  # NumPy has none; TensorFlow's is this one


def floating(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == BFLOAT16


class Binding:
    """One framework's Horovod binding, as the checks use it: its own tensors, and its own way
    of enqueueing several allreduces at once (`fused`)."""

    dtypes: ClassVar[list[type]]  # what it allreduces
    modes: ClassVar = ("single", "fused", "grouped")

    def __init__(self, hvd) -> None:
        self.hvd = hvd
        self.ops = {SUM: hvd.Sum, AVERAGE: hvd.Average, MIN: hvd.Min, MAX: hvd.Max}

    def allreduce(self, pieces: list[np.ndarray], mode: str, reduction: str, name: str):
        op, prescale, postscale = REDUCTIONS[reduction]
        options = {"op": self.ops[op], "prescale_factor": prescale, "postscale_factor": postscale}
        tensors = [self.tensor(piece) for piece in pieces]
        if mode == "single":
            results = [self.hvd.allreduce(tensors[0], name=name, **options)]
        elif mode == "fused":
            results = self.fused(tensors, name, options)
        elif mode == "in place":
            return self.in_place(pieces, name, options)
        else:
            results = self.hvd.grouped_allreduce(tensors, name=name, **options)
        return np.concatenate([self.array(result) for result in results])

    def array(self, tensor) -> np.ndarray:
        return tensor.numpy()

    def allgather(self, row: np.ndarray) -> np.ndarray:
        return self.hvd.allgather(self.tensor(row[None])).numpy()

    def reducescatter(self, values: np.ndarray, name: str) -> np.ndarray:
        """The sum of every rank's `values`, whole: each rank's part of it, gathered."""
        part = self.hvd.reducescatter(self.tensor(values), op=self.hvd.Sum, name=name)
        return self.array(self.hvd.allgather(part))


class Torch(Binding):
    dtypes: ClassVar = [np.int32, np.int64, np.float16, BFLOAT16, np.float32, np.float64]
    modes: ClassVar = (*Binding.modes, "in place")

    def __init__(self) -> None:
        import horovod.torch as hvd
        import torch

        super().__init__(hvd)
        self.torch = torch

    def tensor(self, array: np.ndarray):
        """torch takes no NumPy bfloat16: its bits, as int16, viewed as torch's."""
        if array.dtype == BFLOAT16:
            return self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(array)

    def array(self, tensor) -> np.ndarray:
        if tensor.dtype == self.torch.bfloat16:
            return tensor.view(self.torch.int16).numpy().view(BFLOAT16)
        return tensor.numpy()

    def fused(self, tensors: list, name: str, options: dict) -> list:
        """Asynchronous handles, all enqueued before the first is waited for."""
        handles = [self.hvd.allreduce_async(tensor, name=f"{name}.{index}", **options)
                   for index, tensor in enumerate(tensors)]  # fmt: skip
        return [self.hvd.synchronize(handle) for handle in handles]

    def in_place(self, pieces: list[np.ndarray], name: str, options: dict) -> np.ndarray:
        """The pieces as the consecutive slices of one buffer, reduced in place in one group."""
        flat = self.tensor(np.concatenate(pieces))
        self.hvd.grouped_allreduce_(list(flat.split([len(p) for p in pieces])), name=name,
                                    **options)  # fmt: skip
        return self.array(flat)


class TensorFlow(Binding):
    dtypes: ClassVar = [np.uint8, np.int8, np.int32, np.int64, np.float16, BFLOAT16, np.float32,
                        np.float64]  # fmt: skip

    def __init__(self) -> None:
        import horovod.tensorflow as hvd
        import tensorflow as tf

        super().__init__(hvd)
        self.tensor, self.tf = tf.constant, tf

    def fused(self, tensors: list, name: str, options: dict) -> list:
        """One graph, whose allreduces TensorFlow enqueues together."""

        @self.tf.function(autograph=False)
        def fused(tensors):
            return [self.hvd.allreduce(t, name=f"{name}.{index}", **options)
                    for index, t in enumerate(tensors)]  # fmt: skip

        return fused(tensors)


BFLOAT16_SPECIALS = [
    ("inf+1", np.inf, 1.0),
    ("inf-inf", np.inf, -np.inf),
    ("nan+1", np.array([0x7F81], np.uint16).view(BFLOAT16)[0], 1.0),
    ("-nan+2", -np.nan, 2.0),
    ("overflow", 3.0e38, 3.0e38),
]


LANES = (0, 9, 20, 33, 34)  # where `lanes` puts the special value among 35 elements


def lanes(special: float, finite: float, dtype: type) -> np.ndarray:
    """35 elements of `finite`, but `special` at LANES."""
    values = np.full(35, finite, np.float64)
    values[list(LANES)] = special
    return values.astype(dtype)


def rank_data(rank: int, size: int, dtype: type, kind: str, count: int) -> np.ndarray:
    """Rank `rank`'s input. `small`: integers whose sums over `size` ranks fit the dtype;
    `wide` (floats): normal numbers spread over many exponents (float16: a standard deviation
    of 1e4, so that sums round and some overflow), whose sums round."""
    rng = np.random.default_rng([rank, count])
    if kind == "small":
        high = min(100, np.iinfo(dtype).max // size) if np.dtype(dtype).kind in "iu" else 100
        high = 16 if dtype == BFLOAT16 else high  # its 8 bits hold sums to 256 exactly
        low = 0 if np.dtype(dtype).kind == "u" else -high
        return rng.integers(low, high, count).astype(dtype)
    scale = 1e4 if dtype == np.float16 else 10.0 ** rng.integers(-8, 8, count)
    return (rng.standard_normal(count) * scale).astype(dtype)


def exact_reference(inputs: list[np.ndarray], reduction: str) -> np.ndarray | None:
    """The answer computed in float64 and rounded once to the dtype, where that is the only
    right answer: where every step (scaling each input, reducing, scaling the result) is exact,
    and for a plain sum of two floats, which IEEE arithmetic rounds once. None elsewhere (a sum
    of three floats depends on the order of its two roundings). A step is exact if its float64
    value survives a round trip through the dtype, or through float32 for float64 data, which
    float64 cannot check itself (a rounded step, such as one scaled by 0.1, has all 53 bits)."""
    dtype, size = inputs[0].dtype, len(inputs)
    probe = np.float32 if dtype == np.float64 else dtype
    op, prescale, postscale = REDUCTIONS[reduction]
    if op == AVERAGE:
        postscale /= size
    values = [x.astype(np.float64) * prescale for x in inputs]
    if op in (MIN, MAX):
        reduced = (np.minimum if op == MIN else np.maximum).reduce(values)
    else:
        reduced = np.sum(values, axis=0)
    result = reduced * postscale
    steps = [*values, reduced, result]
    if all(np.array_equal(s.astype(probe).astype(np.float64), s) for s in steps):
        return result.astype(dtype)
    rounded_once = size == 2 and floating(dtype) and reduction == "sum"
    return result.astype(dtype) if rounded_once else None


def check(framework, case: str, inputs, reduction: str, result: np.ndarray) -> dict:
    """Whether every rank got `result`'s bytes, and whether they are the exact answer."""
    rows = framework.allgather(np.ascontiguousarray(result).view(np.uint8))
    record: dict = {"case": case, "agree": all(np.array_equal(row, rows[0]) for row in rows)}
    if not record["agree"]:
        elements = (rows != rows[0]).reshape(len(rows), -1, result.itemsize).any(axis=(0, 2))
        record["differing_elements"] = int(elements.sum())
    reference = exact_reference(inputs, reduction)
    record["exact"] = None
    if reference is not None:
        nans = floating(result.dtype)
        record["exact"] = bool(np.array_equal(result, reference, equal_nan=nans))
        if not record["exact"]:
            wrong = int(np.flatnonzero(result != reference)[0])
            record["first_wrong"] = [wrong, str(result[wrong]), str(reference[wrong])]
    return record


def run_reducescatter(framework, label: str, inputs: list[np.ndarray]) -> dict:
    """A reduce-scatter's sum against the exact answer, where there is one. Each element is
    reduced once, on one rank, so there is no agreement between ranks to check."""
    name = f"{label}.reducescatter".replace(" ", "_")
    result = framework.reducescatter(inputs[framework.hvd.rank()], name)
    record = check(framework, f"{label} sum reducescatter", inputs, "sum", result)
    return record | {"agree": None}


def run_case(framework, label: str, inputs: list[np.ndarray], reduction: str, mode: str) -> dict:
    mine = inputs[framework.hvd.rank()]
    pieces = [mine] if mode == "single" else np.array_split(mine, PIECES)
    name = f"{label}.{reduction}.{mode}".replace(" ", "_")
    result = framework.allreduce(pieces, mode, reduction, name)
    return check(framework, f"{label} {reduction} {mode}", inputs, reduction, result)


def main() -> None:
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # float16 overflow to inf
    framework = {"torch": Torch, "tensorflow": TensorFlow}[sys.argv[1]]()
    hvd = framework.hvd
    hvd.init()
    size = hvd.size()
    records = []
    for dtype in framework.dtypes:
        for kind in ["small", "wide"] if floating(np.dtype(dtype)) else ["small"]:
            count = 200_000 if (dtype, kind) == (np.float16, "wide") else 1_001
            inputs = [rank_data(rank, size, dtype, kind, count) for rank in range(size)]
            label = f"{np.dtype(dtype).name} {kind}"
            for reduction in REDUCTIONS:
                for mode in framework.modes:
                    records.append(run_case(framework, label, inputs, reduction, mode))
            if dtype in (np.float16, BFLOAT16, np.float32):  # odd lengths: 1,001, 200,000 / 3
                records.append(run_reducescatter(framework, label, inputs))
    # The pairs found in review: rank 0 holds the first value, rank 1 the second, others 0.
    for first, second in [(0.5, 14336.0), (-1.0, 48128.0)]:
        inputs = [np.array([v], np.float16) for v in [first, second, *[0.0] * (size - 2)]]
        label = f"float16 pair({first},{second})"
        for reduction in ("sum", "max"):
            records.append(run_case(framework, label, inputs, reduction, "single"))
        records.append(run_reducescatter(framework, label, [x.repeat(size) for x in inputs]))
    # NaNs of either sign: whichever NaN comes out, every rank gets the same one.
    nans = [np.array([np.nan], np.float32), -np.array([np.nan], np.float32)]
    nans += [np.zeros(1, np.float32)] * (size - 2)
    records.append(run_case(framework, "float32 nans", nans, "sum", "single"))
    # bfloat16's infinities, NaNs (one with the smallest payload) and overflow, as rank 0's and
    # rank 1's values: each sum rounded from float as IEEE says, the same bits on every rank.
    for name, first, second in BFLOAT16_SPECIALS:
        inputs = [np.array([v], BFLOAT16) for v in [first, second, *[0.0] * (size - 2)]]
        for reduction in ("sum", "max"):
            records.append(run_case(framework, f"bfloat16 {name}", inputs, reduction, "single"))
        # The same in the vector lanes and the tail of a longer sum (35 elements: the specials
        # at 0, 9 and 20, inside 8- and 16-lane blocks, and at 33 and 34, past the last whole
        # block), among finite sums; and through a reduce-scatter.
        inputs = [lanes(v, 1.5 + rank, BFLOAT16)
                  for rank, v in enumerate([first, second, *[0.0] * (size - 2)])]  # fmt: skip
        label = f"bfloat16 {name} lanes"
        records.append(run_case(framework, label, inputs, "sum", "single"))
        records.append(run_reducescatter(framework, label, inputs))
    if hvd.rank() == 0:
        with open(sys.argv[2], "w") as out:
            json.dump(records, out, indent=1)
    hvd.shutdown()


if __name__ == "__main__":
    main()
