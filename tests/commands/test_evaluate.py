"""One checkpoint format for both frameworks: a model trained under one framework scores the
same under the other, evaluated by `hvd-train eval` under the real `horovodrun -np 2`."""

import json

import pytest

from hvd_train.distributed.checkpoint_files import checkpoint_name
from tests.horovodrun import assert_no_tensorflow_banners, horovodrun

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.torch,
    pytest.mark.tensorflow,
    pytest.mark.timeout(900),
]


@pytest.mark.parametrize(("writer", "reader"), [("torch", "tensorflow"), ("tensorflow", "torch")])
def test_checkpoint_scores_the_same_under_the_other_framework(writer, reader, short_run, mnist_dir):
    base, _, _ = short_run(writer)
    checkpoint = base / "rank0" / "checkpoints" / checkpoint_name(1, 0)
    metrics = (base / "rank0" / "metrics.jsonl").read_text().splitlines()
    written = next(json.loads(line) for line in metrics if '"eval"' in line)
    evaluation = ["-m", "hvd_train", "eval", "--checkpoint", str(checkpoint), "--json",
                  "--data-dir", str(mnist_dir), "--framework", reader]  # fmt: skip
    result = horovodrun(*evaluation)
    assert_no_tensorflow_banners(result.stdout + result.stderr)
    output = result.stdout.splitlines()
    lines = [line.split(":", 1)[1] for line in output if line.startswith("[0]<stdout>:{")]
    assert len(lines) == 1 and not [line for line in output if line.startswith("[1]<stdout>:")]
    result = json.loads(lines[0])
    assert result["framework"] == reader and result["written_by"] == writer
    assert result["world_size"] == 2
    assert abs(result["test_accuracy"] - written["test_accuracy"]) <= 0.0005
    assert result["test_loss"] == pytest.approx(written["test_loss"], abs=1e-4)
