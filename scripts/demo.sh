#!/usr/bin/env bash
# gradcomp's main job: installs what it needs (Debian 12), builds the
# quickstart example in Release and runs it: 4 in-process workers
# ring-all-reduce a gradient and print bytes and time.
#   bash scripts/demo.sh [arguments for the example]
# Build directory: $GRADCOMP_DEMO_BUILD_DIR (default build-demo).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

if [ ! -f examples/quickstart.cpp ]; then
  echo "demo: examples/quickstart.cpp is not in this checkout" >&2
  exit 1
fi
build="${GRADCOMP_DEMO_BUILD_DIR:-build-demo}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DGRADCOMP_BUILD_TESTS=OFF -DGRADCOMP_BUILD_BENCH=OFF -DGRADCOMP_BUILD_EXAMPLES=ON
cmake --build "$build" --target quickstart -j 2
echo "demo: running $build/examples/quickstart"
"$build/examples/quickstart" "$@"
