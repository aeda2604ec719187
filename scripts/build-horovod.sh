#!/usr/bin/env bash
# Builds Horovod 0.28.1 from its PyPI sdist for the torch and TensorFlow installed in $PYTHON's
# environment, caches the wheel outside the clone, installs it and checks the build.
#
# Why a patched sdist: 0.28.1 (June 2023) is Horovod's last release. It asks for C++14, which
# torch >= 2.1 refuses, and compiles XLA ops whose headers TensorFlow 2.21's wheel does not
# ship. The patch series in horovod-0.28.1/ beside this script fixes both and makes the other
# changes the README lists under "What set-up does, and why": one file per change, applied in
# the order of their names, each saying why and naming the upstream PR if there is one.
#
# Parts: Gloo always; PyTorch and TensorFlow where installed (at least one); MPI when mpicxx is
# on PATH; NCCL when nvcc is.
# CPU instructions: Horovod's CMake adds -mf16c -mavx -mfma where the build host has them, and
# such a wheel dies with SIGILL on a CPU without them. The flags are chosen here instead, named
# in the cache key beside the machine's architecture, and recorded in the wheel
# (horovod/hvd_train_build.json), which `hvd-train doctor` checks against the CPU it runs on:
# this host's (Horovod's own choice), HVD_TRAIN_PORTABLE=1's (x86-64-v2: every x86-64 CPU since
# 2009; the images use it), or HOROVOD_BUILD_ARCH_FLAGS as given.
# Environment: PYTHON (default: python3), HVD_TRAIN_CACHE (default: ~/.cache/hvd_train),
# HVD_TRAIN_PORTABLE, HOROVOD_BUILD_ARCH_FLAGS.
# `build-horovod.sh --key` prints the cache key and exits.
set -euo pipefail

HOROVOD_VERSION=0.28.1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
series=("$here/horovod-$HOROVOD_VERSION"/*.patch)
python="${PYTHON:-python3}"
cache="${HVD_TRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd_train}"

say() { echo "[build-horovod] $*"; }
die() { echo "[build-horovod] error: $*" >&2; exit 1; }

# The flags Horovod's CMake would add on this host (cmake/Utilities.cmake), or portable ones.
arch_flags() {
    if [ -n "${HOROVOD_BUILD_ARCH_FLAGS:-}" ]; then
        echo "$HOROVOD_BUILD_ARCH_FLAGS"
    elif [ "${HVD_TRAIN_PORTABLE:-0}" = 1 ]; then
        if [ "$(uname -m)" = x86_64 ]; then echo "-march=x86-64-v2 -mtune=generic"; else echo "-mtune=generic"; fi
    else
        local native found=()
        native=" $(c++ -march=native -E -v - </dev/null 2>&1 | grep cc1 || true) "
        for flag in -mf16c -mavx -mfma; do
            if [[ "$native" == *" $flag "* || "$native" == *" +${flag#-m} "* ]]; then found+=("$flag"); fi
        done
        # Never empty: CMake takes an empty value as unset, and chooses again.
        if [ ${#found[@]} -gt 0 ]; then echo "${found[*]}"; else echo "-mtune=generic"; fi
    fi
}

command -v "$python" >/dev/null || die "no Python at '$python'; set PYTHON to the interpreter of your environment"
command -v c++ >/dev/null || die "no C++ compiler; install one (Debian: apt-get install g++)"
command -v cmake >/dev/null || die "no cmake; install it (Debian: apt-get install cmake, or pip install cmake)"
command -v patch >/dev/null || die "no patch tool; install it (Debian: apt-get install patch)"

# A framework's version, or nothing when it is not installed.
framework_version() { "$python" -c "import $1; print($1.__version__)" 2>/dev/null || true; }
py_version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
torch_version="$(framework_version torch)"
tf_version="$(framework_version tensorflow)"
[ -n "$torch_version$tf_version" ] \
    || die "neither torch nor tensorflow is installed for $python; install them first (make setup does)"

build_env=(HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1)
parts=(Gloo)
for framework in PyTorch TensorFlow; do
    if [ "$framework" = PyTorch ]; then version="$torch_version"; else version="$tf_version"; fi
    if [ -n "$version" ]; then
        build_env+=("HOROVOD_WITH_${framework^^}=1")
        parts+=("$framework")
    else
        build_env+=("HOROVOD_WITHOUT_${framework^^}=1")
        say "$framework is not installed for $python: building Horovod without it"
    fi
done
features=gloo
if command -v mpicxx >/dev/null; then
    build_env+=(HOROVOD_WITH_MPI=1)
    features+=-mpi
else
    build_env+=(HOROVOD_WITHOUT_MPI=1)
fi
if command -v nvcc >/dev/null && "$python" -c 'import sys, torch; sys.exit(not torch.version.cuda)'; then
    build_env+=(HOROVOD_GPU_OPERATIONS=NCCL)
    features+=-nccl
fi
[ -e "${series[0]}" ] || die "no patches in $here/horovod-$HOROVOD_VERSION/"
patch_hash="$(cat "${series[@]}" | sha256sum | cut -c1-8)"
machine="$(uname -m)"
flags="$(arch_flags)"
build_env+=("HOROVOD_BUILD_ARCH_FLAGS=$flags")
flags_key="$(tr ' ' '+' <<< "$flags" | sed 's/-m//g; s/=/_/g')"
key="horovod-$HOROVOD_VERSION-py$py_version-torch${torch_version:-none}-tf${tf_version:-none}-$features-$machine-$flags_key-$patch_hash"
wheel_dir="$cache/wheels/$key"
if [ "${1:-}" = --key ]; then echo "$key"; exit 0; fi
say "build key: $key"

if ! compgen -G "$wheel_dir/horovod-*.whl" >/dev/null; then
    say "no cached wheel; building Horovod $HOROVOD_VERSION (several minutes)"
    # The sdist's setup.py imports these, and pip builds it without isolation (CMake must see
    # the frameworks installed here), so they must be installed here too.
    "$python" -c 'import packaging, setuptools, wheel' 2>/dev/null \
        || "$python" -m pip install --quiet setuptools wheel packaging
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    "$python" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" \
        || die "could not download the horovod $HOROVOD_VERSION sdist from the package index"
    tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    for change in "${series[@]}"; do
        say "patching: $(head -n 1 "$change")"
        patch --quiet -p1 -d "$src" < "$change" || die "$change does not apply to the sdist"
    done
    say "compiling with ${build_env[*]}"
    env "${build_env[@]}" MAKEFLAGS="-j$(nproc)" \
        "$python" -m pip wheel --no-build-isolation --no-deps "$src" -w "$work/dist" > "$work/build.log" 2>&1 \
        || { tail -n 40 "$work/build.log" >&2; die "the Horovod build failed (log above)"; }
    # The wheel records what it was built for, for `hvd-train doctor`.
    "$python" -m wheel unpack --dest "$work/unpacked" "$work/dist"/horovod-*.whl > /dev/null
    printf '{"machine": "%s", "flags": "%s"}\n' "$machine" "$flags" \
        > "$(echo "$work/unpacked"/horovod-*/horovod)/hvd_train_build.json"
    rm "$work/dist"/horovod-*.whl
    "$python" -m wheel pack --dest-dir "$work/dist" "$work/unpacked"/horovod-* > /dev/null
    mkdir -p "$(dirname "$wheel_dir")"
    # Copy next to the target, then rename: a cache entry is complete or absent.
    cp -r "$work/dist" "$wheel_dir.partial.$$"
    mv -T "$wheel_dir.partial.$$" "$wheel_dir" 2>/dev/null \
        || { rm -rf "$wheel_dir.partial.$$"; say "another build cached this key meanwhile"; }
    say "cached $(ls "$wheel_dir")"
fi

say "installing $(ls "$wheel_dir")"
"$python" -m pip install --quiet --force-reinstall --no-deps "$wheel_dir"/horovod-*.whl
"$python" -m pip install --quiet "$(ls "$wheel_dir"/horovod-*.whl)"  # its own dependencies

bin="$(dirname "$("$python" -c 'import sys; print(sys.executable)')")"
check="$(TF_CPP_MIN_LOG_LEVEL=3 "$bin/horovodrun" --check-build 2>/dev/null)"
echo "$check"
for part in "${parts[@]}"; do
    grep -q "\[X\] $part" <<< "$check" || die "Horovod was built without $part; see the messages above"
done
say "ok"
