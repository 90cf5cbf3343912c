#!/usr/bin/env bash
# The GPU checks of docs/backends.md ("CUDA status") and docs/python.md ("CUDA
# tensors"), as one script for a machine with an NVIDIA GPU, CUDA 13 and a
# python3 with a CUDA build of torch. It
#   1. runs tests/cuda's test_cuda_thrust (every codec under thrust_cuda
#      against seq) and the CUDA benches bench_thrust_cuda and bench_lgc_cuda,
#      from build-cuda/ when they were built there (on the development
#      machine: cmake -S . -B build-cuda -DGRADCOMP_WITH_THRUST=ON
#      -DGRADCOMP_BUILD_TESTS=ON -DGRADCOMP_BUILD_BENCH=ON
#      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90)
#      and they load, else built here with nvcc (EIGEN_INCLUDE: Eigen's headers);
#   2. installs gradcomp's wheel from .whl/ (built for the machine's python)
#      into /tmp/site and runs python/tests/test_cuda.py and test_core.py.
# Logs go to $OUT (default /tmp/gradcomp-cuda-check).
set -u
out=${OUT:-/tmp/gradcomp-cuda-check}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
status=0
{ nvidia-smi -L; nvcc --version | tail -n 2; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())'; nproc; } 2>&1 | tee "$out/machine.txt"

bin=build-cuda
prebuilt_ok=1
for prog in tests/cuda/test_cuda_thrust bench/cuda/bench_thrust_cuda bench/cuda/bench_lgc_cuda; do
  if [ ! -x "$bin/$prog" ] || ldd "$bin/$prog" 2>&1 | grep -q "not found"; then prebuilt_ok=0; fi
done
if [ "$prebuilt_ok" = 0 ]; then
  echo "prebuilt binaries missing or not loadable: building with nvcc" | tee -a "$out/machine.txt"
  bin=/tmp/cuda-build
  mkdir -p $bin/tests/cuda $bin/bench/cuda
  eigen=${EIGEN_INCLUDE:-.devdeps/eigen3}
  flags=(-O3 -std=c++20 -arch=sm_90 -DGRADCOMP_HAS_THRUST=1 -Iinclude -isystem "$eigen" -diag-suppress=20012,20013,20014,20015)
  nvcc "${flags[@]}" tests/cuda/*.cu -lcublas -o $bin/tests/cuda/test_cuda_thrust & p1=$!
  nvcc "${flags[@]}" bench/cuda/bench_thrust_cuda.cu bench/cuda/gradiveq_cuda_bench.cu -lcublas -o $bin/bench/cuda/bench_thrust_cuda & p2=$!
  nvcc "${flags[@]}" bench/cuda/bench_lgc_cuda.cu bench/cuda/lgc_bench_layout.cpp -lcublas -o $bin/bench/cuda/bench_lgc_cuda & p3=$!
  for p in $p1 $p2 $p3; do wait "$p" || { echo "nvcc failed" | tee -a "$out/machine.txt"; status=1; }; done
fi
for prog in tests/cuda/test_cuda_thrust bench/cuda/bench_thrust_cuda bench/cuda/bench_lgc_cuda; do
  name=$(basename $prog)
  echo "== $name" | tee "$out/$name.log"
  timeout 240 $bin/$prog 2>&1 | tee -a "$out/$name.log"
  rc=${PIPESTATUS[0]}
  echo "exit status $rc" | tee -a "$out/$name.log"
  [ "$rc" = 0 ] || status=1
done

if ls .whl/gradcomp-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/gradcomp-*.whl
  (export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
   timeout 300 python3 -m pytest -p no:cacheprovider -q -s python/tests/test_cuda.py python/tests/test_core.py) 2>&1 | tee "$out/pytest_cuda.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit $status
