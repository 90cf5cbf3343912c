#!/usr/bin/env bash
# Makes (or reuses) the Python virtual environment of gradcomp's Python
# package and its tests: PyPI's torch (pinned), numpy, pytest and the build
# requirements (scikit-build-core, nanobind). Wheels are kept in a cache
# directory that later runs reuse (pip download once, then install with
# --no-index from the cache), so a second machine run needs no network.
#   bash scripts/python-env.sh          prints the venv's python on its last line
#   GRADCOMP_PY_CACHE=DIR               cache directory (default ~/.cache/gradcomp-python)
#   GRADCOMP_PYTHON=python3.11          interpreter the venv is made from (default python3)
# PyPI's Linux torch pulls its CUDA libraries (about 3 GB of wheels, a 5.4 GB
# venv): `pip install torch --no-deps` does not import (libtorch_cuda.so
# needs libcufile, libcusparseLt, libnvshmem and a matching NCCL), so the
# full dependency set is installed (docs/testing.md has the measured times).
set -euo pipefail

torch_version=2.15.0
requirements=("torch==${torch_version}" numpy pytest "scikit-build-core>=0.10" "nanobind>=2.0")

cache="${GRADCOMP_PY_CACHE:-$HOME/.cache/gradcomp-python}"
python="${GRADCOMP_PYTHON:-python3}"
venv="$cache/venv-torch"
wheels="$cache/wheels"
stamp="$venv/.gradcomp-requirements"
want="$(printf '%s\n' "${requirements[@]}")"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "python-env: $venv is ready (torch $torch_version)" >&2
  echo "$venv/bin/python"
  exit 0
fi

mkdir -p "$wheels"
start=$SECONDS
# Download only what the cache lacks (pip skips wheels already in $wheels).
if ! "$python" -m pip install --dry-run -q --no-index --find-links "$wheels" --ignore-installed \
      "${requirements[@]}" >/dev/null 2>&1; then
  echo "python-env: downloading wheels into $wheels" >&2
  "$python" -m pip download -q --only-binary=:all: -d "$wheels" "${requirements[@]}" >&2
fi
downloaded=$SECONDS
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --no-index --find-links "$wheels" "${requirements[@]}" >&2
printf '%s\n' "$want" > "$stamp"
echo "python-env: venv made in $((SECONDS - start)) s (download $((downloaded - start)) s, install $((SECONDS - downloaded)) s)" >&2
echo "$venv/bin/python"
