"""Trackers against the real thing: an MLflow tracking server started here on localhost with a
SQLite store, read back through MLflow's client; the CSV tracker; a server that is down or
refuses (training goes on, one warning line, the records kept locally)."""

import csv
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hvd_train.distributed.checkpoint_files import best_checkpoint, checkpoint_name
from tests.helpers import hvd_train
from tests.horovodrun import horovodrun, script

RECIPE = script("events_recipe.py")
EXPERIMENT = "hvd_train-tests"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a free port, its runs in SQLite and its artifacts in a folder."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
               "--port", str(port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{root / 'runs.db'}",
               "--artifacts-destination", str(root / "artifacts")]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail("the MLflow server did not start in 120 s")
            time.sleep(0.5)
    yield uri
    server.terminate()
    server.wait(timeout=30)


def runs_of(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_mlflow_and_csv_take_the_recipe_every_record_and_the_artifacts(mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    environment = {"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": EXPERIMENT,
                   "EVENTS": str(tmp_path / "events")}  # fmt: skip
    result = hvd_train("--recipe", RECIPE, "--output-dir", str(run), "--log-every", "5",
                       "--track", "mlflow", "--track", "csv", env=environment)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stdout + result.stderr
    [tracked] = [r for r in runs_of(mlflow_server) if r.info.run_name == run.name]
    assert tracked.info.status == "FINISHED"
    params = tracked.data.params
    assert params["schedule.epochs"] == "2" and params["optimizer.name"] == "adam"
    # Every record's figures, at its global step: the losses as metrics.jsonl holds them.
    client = MlflowClient(tracking_uri=mlflow_server)
    written = records(run)
    trained = [(r["step"], r["loss"]) for r in written if r["kind"] == "train"]
    history = client.get_metric_history(tracked.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == pytest.approx(trained)
    summary = json.loads((run / "summary.json").read_text())
    assert tracked.data.metrics["test_loss"] == pytest.approx(summary["test_loss"])
    artifacts = {a.path for a in client.list_artifacts(tracked.info.run_id)}
    assert {"summary.json", "curves.png", "checkpoint"} <= artifacts
    newest = f"checkpoint/{checkpoint_name(2, 0)}"
    saved = {a.path for a in client.list_artifacts(tracked.info.run_id, newest)}
    assert f"{newest}/model.safetensors" in saved
    # The CSV: a row per record, a column per key.
    with (run / "metrics.csv").open() as table:
        rows = list(csv.DictReader(table))
    assert len(rows) == len(written)
    assert [float(row["loss"]) for row in rows if row["kind"] == "train"] == [
        loss for _, loss in trained
    ]


def test_trackers_named_by_the_recipe_and_the_best_checkpoint_as_the_artifact(
    mlflow_server, tmp_path
):
    from mlflow.tracking import MlflowClient

    run = tmp_path / "named-by-the-recipe"
    environment = {"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": EXPERIMENT,
                   "EVENTS": str(tmp_path / "events")}  # fmt: skip
    result = hvd_train("--recipe", RECIPE, "--output-dir", str(run),
                       "--set", 'output.trackers=["mlflow", "csv"]',
                       "--set", "data.validation_fraction=0.25",
                       "--set", "checkpoints.keep_best=2", env=environment)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (run / "metrics.csv").exists()
    [tracked] = [r for r in runs_of(mlflow_server) if r.info.run_name == run.name]
    assert tracked.data.params["output.trackers"] == "['mlflow', 'csv']"
    client = MlflowClient(tracking_uri=mlflow_server)
    artifacts = {a.path for a in client.list_artifacts(tracked.info.run_id)}
    assert "best" in artifacts and "checkpoint" not in artifacts
    best = best_checkpoint(run / "best")
    assert best is not None
    kept = {a.path for a in client.list_artifacts(tracked.info.run_id, "best")}
    assert kept == {f"best/{best.name}"}


class Refusing(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(403)
        self.end_headers()
        self.wfile.write(b"forbidden")

    do_POST = do_GET

    def log_message(self, *arguments):
        pass


@pytest.mark.parametrize("server", ["down", "refusing"])
def test_a_tracking_server_that_is_down_or_refuses_is_one_warning(server, tmp_path):
    if server == "refusing":
        refusing = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
        threading.Thread(target=refusing.serve_forever, daemon=True).start()
        uri = f"http://127.0.0.1:{refusing.server_address[1]}"
    else:
        uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    run = tmp_path / "run"
    environment = {"MLFLOW_TRACKING_URI": uri, "EVENTS": str(tmp_path / "events")}
    result = hvd_train("--recipe", RECIPE, "--output-dir", str(run), "--track", "mlflow",
                       env=environment)  # fmt: skip
    assert result.returncode == 0, result.stderr
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "warning" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("hvd-train: warning: the mlflow tracker failed (")
    assert warnings[0].endswith("training goes on without it, and the records stay in "
                                "metrics.jsonl")  # fmt: skip
    assert [r["kind"] for r in records(run)].count("eval") == 2
    assert (run / "summary.json").exists()


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_ranks_make_one_mlflow_run_from_rank_zero(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
    monkeypatch.setenv("EVENTS", str(tmp_path / "events"))
    run = tmp_path / "two-ranks"
    horovodrun("-m", "hvd_train", "--recipe", RECIPE, "--output-dir", str(run), "--log-every",
               "2", "--track", "mlflow")  # fmt: skip
    [tracked] = [r for r in runs_of(mlflow_server) if r.info.run_name == run.name]
    trained = [r["loss"] for r in records(run) if r["kind"] == "train"]
    assert tracked.data.metrics["loss"] == pytest.approx(trained[-1])
