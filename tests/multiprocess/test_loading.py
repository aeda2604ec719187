"""Data workers under the real `horovodrun -np 2`: batches read ahead by threads train exactly
the weights that batches read in the step train, the summary splits out the wait for data
(T_data), and a run whose steps wait for their data says so once, with the setting to change."""

import json

import pytest

from tests.conftest import FRAMEWORKS
from tests.helpers import assert_same_weights, saved_weights
from tests.multiprocess.conftest import HERE, horovodrun

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]
RECIPE = str(HERE / "slow_source.py")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_workers_read_ahead_the_batches_the_step_would_read(framework, tmp_path):
    runs = {}
    for workers in (0, 3):
        run = tmp_path / f"workers-{workers}"
        result = horovodrun("-m", "hvd_train", "--recipe", RECIPE, "--framework", framework,
                            "--log-every", "8", "--set", f"data.workers={workers}",
                            "--output-dir", str(run))  # fmt: skip
        summary = json.loads((run / "summary.json").read_text())
        assert summary["settings"]["data"]["workers"] == workers
        runs[workers] = (result.stdout + result.stderr, summary)
    assert_same_weights(saved_weights(tmp_path / "workers-0", 2),
                        saved_weights(tmp_path / "workers-3", 2))  # fmt: skip
    alone, ahead = runs[0][1], runs[3][1]
    # In the step, every step waits out the source's 10 ms; three threads read while the steps
    # run (torch, 2026-11-25: T_data 10.4 ms in the step, 5.2 ms read ahead).
    assert alone["t_data_ms"] >= 10 and ahead["t_data_ms"] < 0.75 * alone["t_data_ms"]
    said = [line for line in runs[0][0].splitlines() if "waited for their batches" in line]
    assert len(said) == 1 and "with 0 data workers" in said[0] and "data.workers=N" in said[0]
    assert said[0].startswith("[0]<stderr>:") or said[0].startswith("[0]<stdout>:")
