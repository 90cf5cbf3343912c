#!/usr/bin/env bash
# gradcomp's main job: installs what it needs (Debian 12), builds the
# end-to-end training demo (examples/train: a small ResNet trained
# data-parallel on Fashion-MNIST by 4 in-process workers, every codec side by
# side) in Release and runs it. At the end it prints a table (accuracy, bytes
# per worker per step, compression ratio, aggregation and wall time), writes a
# CSV of the curves and a PNG plot, and prints RESULT lines.
#   bash scripts/demo.sh                     every configuration, default length
#   bash scripts/demo.sh --full              long enough for the accuracies to settle
#   bash scripts/demo.sh --baseline --dgs    only those configurations
#   bash scripts/demo.sh --quickstart        the small ring all-reduce example instead
# Build directory: $GRADCOMP_DEMO_BUILD_DIR (default build-demo).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

build="${GRADCOMP_DEMO_BUILD_DIR:-build-demo}"
target=train
program="$build/examples/train/train"
if [[ "${1:-}" == "--quickstart" ]]; then
  shift
  target=quickstart
  program="$build/examples/quickstart"
fi

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_NATIVE=ON \
  -DGRADCOMP_BUILD_TESTS=OFF -DGRADCOMP_BUILD_BENCH=OFF -DGRADCOMP_BUILD_EXAMPLES=ON
if ! cmake --build "$build" --target "$target" -j 2; then
  echo "demo: building $target failed (for the training demo, libtorch-dev, libcli11-dev and zlib1g-dev are needed: scripts/install-deps.sh installs them)" >&2
  exit 1
fi
echo "demo: running $program $*"
"$program" "$@"
