#!/usr/bin/env bash
# Makes (or reuses) a Python virtual environment for gradcomp's Python package
# and its tests, and prints its python on the last line.
#
#   bash scripts/python-env.sh          PyPI's torch (pinned 2.15.0), numpy, pytest and the build
#                                       requirements (scikit-build-core, nanobind): venv-torch
#   bash scripts/python-env.sh debian   Debian 12's python3-torch 1.13 (apt, scripts/install-deps.sh):
#                                       /usr/bin/python3 with its system site packages (torch, numpy
#                                       as Debian ships them) plus pytest from PyPI: venv-debian
#   GRADCOMP_PY_CACHE=DIR               cache directory (default ~/.cache/gradcomp-python)
#   GRADCOMP_PYTHON=python3.11          interpreter of the PyPI venv (default python3)
#
# Wheels are kept in DIR/wheels, which later runs reuse (pip download once,
# then install with --no-index from the cache); a venv whose requirement list
# is unchanged is reused without any pip call.
# PyPI's Linux torch pulls its CUDA libraries (about 3 GB of wheels, a 5.4 GB
# venv): `pip install torch --no-deps` does not import (libtorch_cuda.so
# needs libcufile, libcusparseLt, libnvshmem and a matching NCCL), so the
# full dependency set is installed (docs/testing.md has the measured times).
set -euo pipefail

torch_version=2.15.0
cache="${GRADCOMP_PY_CACHE:-$HOME/.cache/gradcomp-python}"
wheels="$cache/wheels"
case "${1:-pypi}" in
  pypi)
    requirements=("torch==${torch_version}" numpy pytest "scikit-build-core>=0.10" "nanobind>=2.0")
    python="${GRADCOMP_PYTHON:-python3}"
    venv="$cache/venv-torch"
    venv_flags=()
    ;;
  debian)
    requirements=(pytest)
    python=/usr/bin/python3
    venv="$cache/venv-debian"
    venv_flags=(--system-site-packages)
    if ! "$python" -c 'import torch, numpy' 2>/dev/null; then
      echo "python-env: $python cannot import torch and numpy (apt-get install python3-torch)" >&2
      exit 1
    fi
    ;;
  *) echo "python-env: unknown flavour '$1' (pypi, debian)" >&2; exit 2 ;;
esac
stamp="$venv/.gradcomp-requirements"
want="$(printf '%s\n' "$python" "${requirements[@]}")"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "python-env: $venv is ready" >&2
  echo "$venv/bin/python"
  exit 0
fi

mkdir -p "$wheels"
start=$SECONDS
rm -rf "$venv"
"$python" -m venv "${venv_flags[@]}" "$venv"
pip=("$venv/bin/python" -m pip)
# Install from the wheel cache; download into it only what it lacks.
if ! "${pip[@]}" install -q --no-index --find-links "$wheels" "${requirements[@]}" >/dev/null 2>&1; then
  echo "python-env: downloading wheels into $wheels" >&2
  "${pip[@]}" download -q --only-binary=:all: -d "$wheels" "${requirements[@]}" >&2
  "${pip[@]}" install -q --no-index --find-links "$wheels" "${requirements[@]}" >&2
fi
printf '%s\n' "$want" > "$stamp"
echo "python-env: $venv made in $((SECONDS - start)) s" >&2
echo "$venv/bin/python"
