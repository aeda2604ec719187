"""`hvd-train doctor`, run as a user runs it."""

import os
import subprocess
import sys


def doctor(*arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hvd_train", "doctor", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_a_ready_machine_passes_every_check(mnist_dir):
    result = doctor("--data-dir", str(mnist_dir), "-H", "localhost:2")
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert "[ok] horovod frameworks: PyTorch, TensorFlow" in lines
    assert any(line.startswith("[ok] horovod controllers: Gloo") for line in lines)
    assert f"[ok] data: MNIST in {mnist_dir}, checksums match" in lines
    assert "[ok] localhost: ssh: this machine (horovodrun runs it directly)" in lines
    assert lines[-1] == "all checks passed"


def test_missing_data_and_an_unreachable_host_fail_with_their_fixes(tmp_path):
    result = doctor("--data-dir", str(tmp_path), "-H", "nosuch.invalid:4")
    assert result.returncode == 1
    out = result.stdout
    assert f"[FAIL] data: {tmp_path} lacks train-images-idx3-ubyte.gz" in out
    assert "fix: put the four original MNIST files in the folder" in out
    assert "[FAIL] nosuch.invalid: ssh: ssh: Could not resolve hostname nosuch.invalid" in out
    assert "fix: set up password-less SSH: ssh-copy-id nosuch.invalid" in out
    assert out.splitlines()[-1].startswith("2 of ") and out.splitlines()[-1].endswith(
        "checks failed"
    )


def test_an_empty_cache_is_what_will_happen_not_a_failure(tmp_path):
    # Without HVD_TRAIN_DATA_DIR (a developer's shell may set it): the cache is checked.
    environment = {k: v for k, v in os.environ.items() if k != "HVD_TRAIN_DATA_DIR"}
    environment["HVD_TRAIN_CACHE"] = str(tmp_path / "cache")
    result = subprocess.run([sys.executable, "-m", "hvd_train", "doctor"], capture_output=True,
                            text=True, timeout=300, env=environment)  # fmt: skip
    assert (
        f"[ok] data: MNIST is not cached yet in {tmp_path}/cache/mnist; it is fetched on first use"
        in result.stdout
    )
    (tmp_path / "file").write_text("")  # a cache that cannot be made: its parent is a file
    environment["HVD_TRAIN_CACHE"] = str(tmp_path / "file" / "cache")
    result = subprocess.run([sys.executable, "-m", "hvd_train", "doctor"], capture_output=True,
                            text=True, timeout=300, env=environment)  # fmt: skip
    assert result.returncode == 1
    assert f"[FAIL] data: {tmp_path}/file/cache/mnist cannot be written" in result.stdout
