import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Framework-neutral tests run once per framework by parametrising over these.
FRAMEWORKS = [
    pytest.param("torch", marks=pytest.mark.torch),
    pytest.param("tensorflow", marks=pytest.mark.tensorflow),
]


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """Real MNIST: $HVD_TRAIN_TEST_MNIST, else ../shared/data/mnist, else the user's cache."""
    for candidate in (os.environ.get("HVD_TRAIN_TEST_MNIST"), REPO.parent / "shared/data/mnist"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    from hvd_train.data.mnist import fetch_into_cache

    return fetch_into_cache()


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test():
    """A job a test started in the background (tests/horovodrun.py) is killed, with its
    workers, at the test's end if it still runs then."""
    from tests.horovodrun import STARTED, kill_job

    yield
    while STARTED:
        job = STARTED.pop()
        if job.poll() is None:
            kill_job(job)


@pytest.fixture(scope="session")
def short_run(mnist_dir, tmp_path_factory) -> Callable[[str], tuple[Path, list[str], str]]:
    """One epoch of STEPS steps under `horovodrun -np 2`, once per framework per session.

    Each rank gets its own --output-dir (BASE/rank<r>) so tests can see who wrote what.
    Returns BASE, the CLI arguments used and the combined output.
    """
    from tests.horovodrun import STEPS, horovodrun, script

    @functools.cache
    def run(framework: str) -> tuple[Path, list[str], str]:
        base = tmp_path_factory.mktemp(f"short-{framework}")
        arguments = ["--framework", framework, "--data-dir", str(mnist_dir), "--epochs", "1",
                     "--limit-steps", str(STEPS), "--log-every", "20",
                     "--horovod-timeline", str(base / "timeline.json")]  # fmt: skip
        result = horovodrun(script("cli_per_rank.py"), str(base), *arguments)
        return base, arguments, result.stdout + result.stderr

    return run


@pytest.fixture(scope="session", autouse=True)
def _pytest_loads_no_horovod_binding():
    """Adapters run in subprocesses only: pytest itself must never hold a Horovod binding."""
    yield
    assert not {"horovod.torch", "horovod.tensorflow"} & set(sys.modules)


ONE_PROCESS = "one-process"  # the whole suite's xdist group of the one-process tests

# Suites that install system software and take long: each runs only with its option.
OPT_IN = {
    "containers": "also build and run the Docker images (make test-containers)",
    "clusters": "also run the Slurm cluster and Ray tests (make test-clusters)",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    for name, help in OPT_IN.items():
        parser.addoption(f"--{name}", action="store_true", help=help)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `containers` or `clusters` run only with that option, whatever -m says.
    Under pytest-xdist (`-n 2 --dist loadgroup`, as make test runs), the multi-process tests
    run one after another on one worker, each with the cores its ranks pin, while the other
    worker takes the one-process tests. In the whole suite (no -m) those form a group of their
    own too, whose worker yields the cores (pytest_runtest_setup)."""
    whole = not config.option.markexpr
    for item in items:
        if item.get_closest_marker("multiprocess"):
            item.add_marker(pytest.mark.xdist_group("multiprocess"))
        elif whole:
            item.add_marker(pytest.mark.xdist_group(ONE_PROCESS))
    # Horovod's own suites last, once the one-process tests are done: their hundreds of Horovod
    # starts then have the cores to themselves (beside them, one start aborted in hvd.init).
    items.sort(key=lambda item: "test_upstream.py" in item.nodeid)
    for name in OPT_IN:
        if config.getoption(f"--{name}"):
            continue
        left_out = [item for item in items if item.get_closest_marker(name)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker(name)]


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist 3.8 groups tests (`--dist loadgroup`) by renaming them in a way pytest 9
    ignores: the two-rank jobs would then share the cores, and fail by their timeouts."""
    grouping = getattr(config.option, "dist", "no") == "loadgroup"
    if grouping and int(pytest.__version__.split(".")[0]) >= 9:
        raise pytest.UsageError(
            f"pytest {pytest.__version__} cannot group tests with pytest-xdist's --dist "
            'loadgroup; install "pytest>=8,<9", as pyproject.toml\'s dev group does (make setup)'
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """In the whole suite under pytest-xdist, the one-process tests' worker (and every process
    it starts) runs under Linux's idle scheduling policy: the multi-process tests, which set the
    suite's time, take a core back the moment a rank wakes, and the one-process tests fill the
    gaps between. Two ranks step in lockstep, so a moment taken from either stops both; at
    nice 19 a task still keeps the core to the end of its slice (docs/history.md, "The two-rank
    jobs first")."""
    group = item.get_closest_marker("xdist_group")
    one_process = group is not None and group.args == (ONE_PROCESS,)
    if one_process and "PYTEST_XDIST_WORKER" in os.environ:  # a worker, not pytest's own process
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # the same again: no change
