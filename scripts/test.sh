#!/usr/bin/env bash
# gradcomp's whole test suite (what .ci/run runs). Installs what it needs on
# Debian 12 (scripts/install-deps.sh), then runs these stages, each in its own
# build directory under $GRADCOMP_CI_DIR (default build-ci/):
#
#   release    Release build of everything (tests, benches, examples; Thrust and
#              MPI components on; -O1), the unit tests built once, unoptimized,
#              with -fsanitize=address,undefined (GRADCOMP_TEST_SANITIZERS), then
#              the whole ctest suite: unit tests under ASan+UBSan, their
#              optimized instruction-set variants, MPI tests under mpirun,
#              standalone-header check, consumer and packaging tests
#              (install/build-tree/add_subdirectory/FetchContent, Conan recipe,
#              vcpkg port)
#   quickstart runs the Release build's examples/quickstart (the main job)
#   tsan       -fsanitize=thread build of the transport, ring and driver tests
#   fuzz       clang libFuzzer build of fuzz/ (ASan+UBSan), each fuzzer run for
#              $GRADCOMP_FUZZ_SECONDS (default 60) on a copy of fuzz/corpus/<name>
#   python     the Python package: a venv with PyPI's torch 2.15.0 (scripts/python-env.sh,
#              wheels cached in ~/.cache/gradcomp-python), the package's wheel
#              (scikit-build-core + nanobind), then pytest python/tests (DDP comm
#              hooks on gloo with 2 and 4 processes); again with Debian's
#              python3-torch 1.13 (/usr/bin/python3, system site packages)
#
#   bash scripts/test.sh                 every stage
#   bash scripts/test.sh quick           the release stage only
#   bash scripts/test.sh tsan fuzz       just those stages (any of the names above)
#   GRADCOMP_SKIP_DEPS=1 bash scripts/test.sh ...   do not call install-deps.sh
#
# Every stage runs even when an earlier one failed; the exit status is non-zero
# if any stage failed. A stage whose sources are not in the checkout yet
# (fuzz/CMakeLists.txt, examples/quickstart.cpp) is skipped with a message.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

jobs="${GRADCOMP_JOBS:-2}"
ci="${GRADCOMP_CI_DIR:-$root/build-ci}"
fuzz_seconds="${GRADCOMP_FUZZ_SECONDS:-60}"
all_stages=(release quickstart tsan fuzz python)
# Ninja builds the several targets of one `cmake --build --target a b c` in
# parallel (CMake's Makefiles build them one after the other).
generator=()
keep_going=(-- -k)          # make: keep building the other targets after an error
if command -v ninja >/dev/null; then
  generator=(-G Ninja)
  keep_going=(-- -k 0)
fi

stages=()
for arg in "$@"; do
  case "$arg" in
    quick) stages+=(release) ;;
    all) stages+=("${all_stages[@]}") ;;
    release|quickstart|tsan|fuzz|python) stages+=("$arg") ;;
    asan) echo "test.sh: the asan stage is part of the release stage now (its unit tests run under ASan+UBSan)" >&2
          stages+=(release) ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "test.sh: unknown stage '$arg' (stages: ${all_stages[*]} quick all)" >&2; exit 2 ;;
  esac
done
[ "${#stages[@]}" -eq 0 ] && stages=("${all_stages[@]}")

if [ "${GRADCOMP_SKIP_DEPS:-0}" != 1 ]; then
  bash scripts/install-deps.sh || { echo "test.sh: installing dependencies failed" >&2; exit 1; }
fi
mkdir -p "$ci"

summary=()   # one line per stage
failed=0
suite_start=$SECONDS

banner() { printf '\n==== %s ====\n' "$*"; }

# Runs `ctest "$@"` in build dir $1, keeping its summary lines for the end.
run_ctest() {
  local dir="$1"; shift
  local log="$dir/ctest.log"
  (cd "$dir" && ctest --output-on-failure -j "$jobs" "$@") 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  ctest_summary="$(grep -E 'tests passed|Total Test time' "$log" | tr '\n' ' ')"
  return "$status"
}

# Unit test names (test_<name>) whose name matches the ERE $1 (all if empty).
unit_tests() {
  local pattern="${1:-.}" f name
  for f in tests/unit/test_*.cpp; do
    [ -e "$f" ] || continue
    name="$(basename "$f" .cpp)"
    [[ "${name#test_}" =~ $pattern ]] && echo "$name"
  done
}

stage_release() {
  local dir="$ci/release"
  # -O1 rather than CMake's Release default -O3: optimized code (inlined
  # kernels, NDEBUG) for about half -O2's compile time on a lone compile
  # (less with two jobs at once), which is most of this stage on 2 cores. The mixed-ISA ABI units build at -O2 regardless
  # (tests/abi). The benches' figures come from bench/run_all, which builds at
  # -O3 in a directory of its own.
  local options=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG"
                 "-DCMAKE_CUDA_FLAGS_RELEASE=-O1 -DNDEBUG"
                 -DGRADCOMP_BUILD_TESTS=ON -DGRADCOMP_BUILD_BENCH=ON -DGRADCOMP_BUILD_EXAMPLES=ON
                 # The unit tests (only they) unoptimized and sanitized
                 # (tests/CMakeLists.txt): one build of them, not this stage's
                 # plus a separate ASan build.
                 -DGRADCOMP_TEST_SANITIZERS=address,undefined)
  if ! cmake "${generator[@]}" -S . -B "$dir" "${options[@]}" -DGRADCOMP_WITH_THRUST=ON -DGRADCOMP_WITH_MPI=ON; then
    echo "test.sh: configuring with GRADCOMP_WITH_THRUST=ON GRADCOMP_WITH_MPI=ON failed; retrying without them" >&2
    rm -rf "$dir"
    cmake "${generator[@]}" -S . -B "$dir" "${options[@]}" -DGRADCOMP_WITH_THRUST=OFF -DGRADCOMP_WITH_MPI=OFF || return 1
    stage_note="(without thrust/mpi: they did not configure)"
  fi
  # On a build error, still build and run everything else, so one run reports
  # every failure; the stage fails either way.
  local build_status=0
  cmake --build "$dir" -j "$jobs" "${keep_going[@]}" || build_status=1
  run_ctest "$dir"
  local ctest_status=$?
  if [ "$build_status" -ne 0 ]; then
    stage_note="BUILD FAILED (see the errors above; missing executables show as failed tests) $stage_note"
    return 1
  fi
  return "$ctest_status"
}

# Notes (and prints) why a stage is skipped; the stage then returns 0.
skip_stage() {
  stage_note="skipped: $1"
  echo "test.sh: $stage_note"
}

stage_quickstart() {
  [ -f examples/quickstart.cpp ] || { skip_stage "examples/quickstart.cpp is not in this checkout"; return 0; }
  local dir="$ci/release"
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake "${generator[@]}" -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_BUILD_TESTS=OFF -DGRADCOMP_BUILD_BENCH=OFF || return 1
  fi
  cmake --build "$dir" --target quickstart -j "$jobs" || return 1
  "$dir/examples/quickstart"
}

# ThreadSanitizer needs a memory layout some kernels' ASLR settings break
# (vm.mmap_rnd_bits=32); then the tests run with ASLR off through setarch.
tsan_prefix=()
check_tsan() {
  local probe="$ci/tsan-probe"
  mkdir -p "$probe"
  printf '#include <thread>\nint x; int main(){ std::thread t([]{ x = 1; }); t.join(); return x - 1; }\n' > "$probe/probe.cpp"
  g++ -fsanitize=thread -g "$probe/probe.cpp" -o "$probe/probe" || return 1
  if "$probe/probe" 2>/dev/null; then return 0; fi
  if setarch "$(uname -m)" -R "$probe/probe" 2>/dev/null; then
    echo "test.sh: ThreadSanitizer needs ASLR off on this kernel; running the TSan tests under setarch -R"
    tsan_prefix=(setarch "$(uname -m)" -R)
    return 0
  fi
  echo "test.sh: ThreadSanitizer does not run on this machine" >&2
  return 1
}

stage_tsan() {
  local dir="$ci/tsan"
  local pattern='transport|ring|server|inproc|driver'
  check_tsan || return 1
  cmake "${generator[@]}" -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
    -DGRADCOMP_BUILD_TESTS=ON -DGRADCOMP_BUILD_BENCH=OFF -DGRADCOMP_BUILD_EXAMPLES=OFF \
    -DGRADCOMP_WITH_THRUST=OFF -DGRADCOMP_WITH_MPI=OFF || return 1
  local targets
  mapfile -t targets < <(unit_tests "$pattern")
  [ "${#targets[@]}" -gt 0 ] || { skip_stage "no unit test matches /$pattern/ yet"; return 0; }
  echo "test.sh: TSan tests: ${targets[*]}"
  local build_status=0
  cmake --build "$dir" -j "$jobs" --target "${targets[@]}" "${keep_going[@]}" || build_status=1
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
    "${tsan_prefix[@]}" bash -c 'cd "$1" && shift && exec ctest --output-on-failure -j "$@"' _ \
      "$dir" "$jobs" -L unit -R "unit\\.(.*($pattern).*)\$" 2>&1 | tee "$dir/ctest.log"
  local status=${PIPESTATUS[0]}
  ctest_summary="$(grep -E 'tests passed|Total Test time' "$dir/ctest.log" | tr '\n' ' ')"
  [ "$build_status" -eq 0 ] || { stage_note="BUILD FAILED"; return 1; }
  return "$status"
}

stage_fuzz() {
  [ -f fuzz/CMakeLists.txt ] || { skip_stage "fuzz/CMakeLists.txt is not in this checkout"; return 0; }
  local dir="$ci/fuzz"
  cmake "${generator[@]}" -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DGRADCOMP_BUILD_FUZZERS=ON -DGRADCOMP_BUILD_TESTS=OFF -DGRADCOMP_BUILD_BENCH=OFF \
    -DGRADCOMP_BUILD_EXAMPLES=OFF -DGRADCOMP_WITH_THRUST=OFF -DGRADCOMP_WITH_MPI=OFF || return 1
  local fuzzers=() f name
  for f in fuzz/fuzz_*.cpp; do
    [ -e "$f" ] && fuzzers+=("$(basename "$f" .cpp)")
  done
  [ "${#fuzzers[@]}" -gt 0 ] || { skip_stage "no fuzz/fuzz_*.cpp"; return 0; }
  cmake --build "$dir" -j "$jobs" --target "${fuzzers[@]}" || return 1
  local status=0 bin corpus
  for name in "${fuzzers[@]}"; do
    bin="$(find "$dir" -type f -name "$name" -perm -u+x | head -n 1)"
    [ -n "$bin" ] || { echo "test.sh: $name was not built" >&2; return 1; }
    # libFuzzer writes new inputs into the first corpus directory: a copy,
    # so the checked-in corpus stays as it is.
    corpus="$dir/corpus/$name"
    rm -rf "$corpus" && mkdir -p "$corpus"
    if [ -d "fuzz/corpus/${name#fuzz_}" ]; then
      cp -r "fuzz/corpus/${name#fuzz_}/." "$corpus/"
    elif [ -d "fuzz/corpus/$name" ]; then
      cp -r "fuzz/corpus/$name/." "$corpus/"
    fi
    echo "test.sh: $name for ${fuzz_seconds}s on $(ls "$corpus" | wc -l) seed inputs"
    mkdir -p "$dir/artifacts"
    if ! (cd "$dir" && "$bin" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 \
            -print_final_stats=1 -artifact_prefix="$dir/artifacts/$name-" "$corpus"); then
      echo "test.sh: $name found a failure; reproducer in $dir/artifacts/" >&2
      status=1
    fi
  done
  stage_note="${fuzzers[*]} ${fuzz_seconds}s each"
  return "$status"
}

# pytest in the venv of python $1 (label $2), with gradcomp's wheel installed.
run_pytest() {
  local py="$1" label="$2" t0=$SECONDS
  "$py" -m pip install -q --force-reinstall --no-deps --no-index "$ci"/python/dist/gradcomp-*.whl || return 1
  local log="$ci/python/pytest-$label.log"
  (cd "$root" && "$py" -m pytest -p no:cacheprovider -q --durations=8 python/tests) 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  ctest_summary+="pytest ($label): $(grep -E '[0-9]+ (passed|failed)' "$log" | tail -n 1) ($((SECONDS - t0)) s). "
  return "$status"
}

stage_python() {
  [ -f pyproject.toml ] || { skip_stage "pyproject.toml is not in this checkout"; return 0; }
  local py t0 status=0
  t0=$SECONDS
  py="$(bash scripts/python-env.sh | tail -n 1)" || { stage_note="making the venv FAILED"; return 1; }
  echo "test.sh: python venv ready in $((SECONDS - t0)) s ($py)"
  t0=$SECONDS
  # One wheel (the module links no libtorch) for every torch below. The build
  # requirements are in the venv: no isolation, no index (works offline).
  rm -rf "$ci/python/dist"
  if ! "$py" -m pip wheel -q --no-build-isolation --no-index --no-deps -w "$ci/python/dist" \
       --config-settings=build-dir="$ci/python/{wheel_tag}" "$root"; then
    stage_note="building the wheel FAILED"
    return 1
  fi
  echo "test.sh: gradcomp wheel built in $((SECONDS - t0)) s"
  run_pytest "$py" "torch 2.15.0" || status=1
  # Debian 12's python3-torch 1.13, the oldest torch supported (installed by install-deps.sh).
  if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    py="$(bash scripts/python-env.sh debian | tail -n 1)" || { stage_note="the Debian venv FAILED"; return 1; }
    run_pytest "$py" "debian torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')" || status=1
  else
    stage_note="(Debian's python3-torch is not installed: torch 1.13 not tested)"
  fi
  return "$status"
}

for stage in "${stages[@]}"; do
  banner "stage $stage"
  start=$SECONDS
  stage_note=""
  ctest_summary=""
  if "stage_$stage"; then
    result=passed
  else
    result=FAILED
    failed=1
  fi
  elapsed=$((SECONDS - start))
  summary+=("$(printf '%-10s %-7s %4dm%02ds  %s %s' "$stage" "$result" $((elapsed / 60)) $((elapsed % 60)) \
                "$ctest_summary" "$stage_note")")
done

total=$((SECONDS - suite_start))
banner "summary"
for line in "${summary[@]}"; do
  echo "$line"
done
printf 'total      %dm%02ds on %s cores, %s\n' $((total / 60)) $((total % 60)) "$(nproc)" \
  "$([ "$failed" -eq 0 ] && echo 'all stages passed' || echo 'SOME STAGES FAILED')"
exit "$failed"
