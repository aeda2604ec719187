# The README's two commands: `make train` and `make test`. Both set up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
NP ?= 2
FRAMEWORK ?= torch
CONTROLLER ?= --gloo
TORCH_VERSION := 2.13.0
TENSORFLOW_VERSION := 2.21.0
# Horovod's own parallel suites (tests/horovod/test_upstream.py) run against the build wherever
# Horovod v0.28.1's test/ folder is at hand: HOROVOD_TESTS, else the copy in ../shared.
HOROVOD_TESTS ?= $(wildcard $(abspath $(CURDIR)/../shared/horovod-v0.28.1-test/test))
export HOROVOD_TESTS
# With an NVIDIA GPU: CUDA builds of both frameworks (torch's default wheel on PyPI is one).
ifneq ($(shell command -v nvidia-smi),)
TENSORFLOW := tensorflow[and-cuda]==$(TENSORFLOW_VERSION)
else
TENSORFLOW := tensorflow-cpu==$(TENSORFLOW_VERSION)
endif

.PHONY: setup train test test-quick test-containers test-clusters test-upstream lint docs clean

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: pyproject.toml scripts/build-horovod.sh $(wildcard scripts/horovod-0.28.1/*.patch) \
		scripts/install-system-packages.sh
	scripts/install-system-packages.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel packaging
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION) "$(TENSORFLOW)"
	$(PY) -m pip install --quiet --editable . --group dev
	PYTHON=$(PY) scripts/build-horovod.sh
	touch $@

train: setup
	$(VENV)/bin/horovodrun -np $(NP) $(CONTROLLER) $(PY) -m hvd_train --recipe mnist_cnn \
		--framework $(FRAMEWORK)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint docker/Dockerfile.cpu docker/Dockerfile.cuda

# pytest-xdist, one worker per core: the multi-process tests in order on one worker, the
# one-process tests on the others (tests/conftest.py groups them).
PYTEST := $(VENV)/bin/pytest -n auto --dist loadgroup

test: lint
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	$(PYTEST)

# What to run between changes: the unit tests and one short two-rank run per framework.
test-quick: setup
	$(PYTEST) -m "smoke or not (slow or multiprocess)"

# The documentation site (docs/, mkdocs.yml) at http://127.0.0.1:8000, rebuilt as pages change.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# Builds the CPU image and trains in containers (tests/docker/test_images.py): a Docker engine, Compose and
# mmdebstrap are installed and started where this runs as root with apt-get.
test-containers: setup
	scripts/install-system-packages.sh --containers
	$(VENV)/bin/pytest --containers -m containers

# A Slurm cluster of two nodes in network namespaces, and Ray (tests marked clusters): Slurm and munge
# are installed where this runs as root with apt-get, Ray into the environment.
test-clusters: setup
	scripts/install-system-packages.sh --clusters
	$(PY) -m pip install --quiet --editable '.[ray]'
	$(VENV)/bin/pytest --clusters -m clusters

# Horovod's own parallel suites alone (make test runs them too): HOROVOD_TESTS names the test/
# folder of Horovod v0.28.1 (the PyPI sdist ships none, and this project copies none of them).
test-upstream: setup
	test -d "$(HOROVOD_TESTS)/parallel" || { echo "set HOROVOD_TESTS to the test/ folder of Horovod v0.28.1" >&2; exit 2; }
	$(VENV)/bin/pytest tests/horovod/test_upstream.py

clean:
	rm -rf $(VENV) runs .site .pytest_cache .mypy_cache .ruff_cache
