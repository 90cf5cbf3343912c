#!/usr/bin/env bash
# Installs, with apt-get, every Debian 12 package gradcomp's build, tests,
# benches and examples use. Does nothing (and needs no network or root) when
# they are all installed already, so it is cheap to call from every script.
#   bash scripts/install-deps.sh
set -euo pipefail

packages=(
  build-essential cmake ninja-build g++                # compilers and build tools
  clang libclang-rt-14-dev                            # clang, libFuzzer and its sanitizer runtimes
  libeigen3-dev                                       # gradcomp's one hard dependency
  libxsimd-dev                                        # gradcomp::simd
  libthrust-dev                                       # gradcomp::thrust (OpenMP device system)
  libopenmpi-dev openmpi-bin                          # gradcomp::mpi, mpirun for the MPI tests
  libsimgrid-dev                                      # smpicxx/smpirun: the MPI tests under SimGrid SMPI (label smpi)
  doctest-dev                                         # unit tests
  python3 python3-venv                                # packaging.conan: a venv with the Conan 2 client from PyPI
  zlib1g-dev libzstd-dev libcli11-dev                 # examples
  libtorch-dev dataset-fashion-mnist gnuplot-nox      # examples/train: end-to-end training demo
  python3-matplotlib                                  # bench/smpi/run: the speedup PNG
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages are installed"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-deps: missing ${missing[*]}; run as root or install sudo" >&2
    exit 1
  fi
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
