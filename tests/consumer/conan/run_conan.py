#!/usr/bin/env python3
"""ctest packaging.conan: `conan create` of gradcomp's conanfile.py with the real
Conan 2 client from PyPI, which builds and runs test_package/.

Steps (each printed with its time):
  1. a venv under the work dir with conan==<pinned> from PyPI; pip keeps the
     wheels in a cache dir that later runs reuse ($GRADCOMP_CACHE_DIR/pip, else
     $XDG_CACHE_HOME/gradcomp/pip, else ~/.cache/gradcomp/pip); a venv that has
     the pinned version already is used as it is;
  2. a fresh CONAN_HOME under the work dir, `conan profile detect` with the
     build's C++ compiler, Conan Center removed from the remotes (it cannot be
     reached from the test machines);
  3. the dependencies: the test fixtures in tests/consumer/conan/recipes/
     (eigen, xsimd, thrust, openmpi), which wrap Debian's installed packages at
     the versions their headers declare, exported into that CONAN_HOME after
     their python_requires base (recipes/system_fixture);
  4. README.md's Conan command (the `conan create .` line of the "With Conan 2"
     block) run on the checkout, with the build's components as options
     (-o gradcomp/*:with_<c>=True/False), the build's generator and compiler,
     test_package/ copied into the work dir (so that nothing is written into the
     checkout) and --build=missing for the fixtures;
  5. checks: conan's exit status, the lines test_package prints for the core and
     each enabled component, and the version of the created package.

Exit status: 0 pass, 1 fail (with the reason on the last lines), 77 skip: PyPI
cannot be reached and the pinned conan is not installed yet (ctest's
SKIP_RETURN_CODE).
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

SKIP = 77
NETWORK_MARKERS = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                   "Network is unreachable", "Connection refused", "ConnectTimeoutError", "ReadTimeoutError",
                   "Could not fetch URL", "ProxyError", "SSLError", "No route to host",
                   "Name or service not known")


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def log(message):
    print(f"packaging.conan: {message}", flush=True)


def run(argv, env=None, cwd=None, capture=False):
    """Runs argv, echoing it; its output goes to ours (and is returned when capture)."""
    print("+ " + shlex.join(str(a) for a in argv), flush=True)
    if not capture:
        return subprocess.run(argv, env=env, cwd=cwd).returncode, ""
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace")
    lines = []
    for line in process.stdout:
        sys.stdout.write(line)
        lines.append(line)
    sys.stdout.flush()
    return process.wait(), "".join(lines)


def run_json(argv, env):
    """Runs a conan command with --format=json; its JSON (stdout) parsed, or None."""
    print("+ " + shlex.join(str(a) for a in argv), flush=True)
    result = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        return None
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        return None


def cache_dir():
    if os.environ.get("GRADCOMP_CACHE_DIR"):
        return os.path.join(os.environ["GRADCOMP_CACHE_DIR"], "pip")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gradcomp", "pip")


def conan_in_venv(venv, version):
    """The venv's conan executable when it is the pinned version, else None."""
    conan = os.path.join(venv, "bin", "conan")
    if not os.access(conan, os.X_OK):
        return None
    try:
        out = subprocess.run([conan, "--version"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return conan if re.search(rf"\b{re.escape(version)}\b", out) else None


def install_conan(venv, version):
    conan = conan_in_venv(venv, version)
    if conan:
        log(f"conan {version} is installed in {venv} already")
        return conan
    cache = cache_dir()
    log(f"installing conan=={version} from PyPI into {venv} (pip cache: {cache})")
    shutil.rmtree(venv, ignore_errors=True)
    code, out = run([sys.executable, "-m", "venv", venv], capture=True)
    if code != 0:
        raise Failure(f"`{sys.executable} -m venv` failed (Debian: apt-get install python3-venv): {out.strip()}")
    python = os.path.join(venv, "bin", "python")
    code, out = run([python, "-m", "pip", "install", "--disable-pip-version-check", "--cache-dir", cache,
                     "--timeout", "30", "--retries", "2", f"conan=={version}"], capture=True)
    if code != 0:
        shutil.rmtree(venv, ignore_errors=True)
        if any(marker in out for marker in NETWORK_MARKERS):
            raise Skip(f"PyPI cannot be reached, so conan=={version} cannot be installed "
                       "(pip's errors above); the Conan recipe was NOT tested")
        raise Failure(f"pip could not install conan=={version} (pip's output above)")
    conan = conan_in_venv(venv, version)
    if conan is None:
        raise Failure(f"after pip install, {venv}/bin/conan does not report version {version}")
    return conan


def readme_conan_command(source):
    """The `conan create .` line of README.md's "With Conan 2" block, as argv."""
    readme = os.path.join(source, "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"\*\*With Conan 2\*\*.*?```sh\n(.*?)```", text, re.S)
    if not section:
        raise Failure("README.md has no ```sh block after '**With Conan 2**'")
    lines = [line for line in section.group(1).splitlines() if line.strip().startswith("conan create")]
    if len(lines) != 1:
        raise Failure(f"README.md's Conan block must hold one `conan create` line, found {len(lines)}")
    argv = shlex.split(lines[0])
    if argv[:3] != ["conan", "create", "."]:
        raise Failure(f"README.md's Conan command must start with `conan create .`: {lines[0]}")
    return argv[3:]


def compilers(cxx):
    """(CC, CXX) for the profile: the C compiler next to the build's C++ compiler."""
    name = os.path.basename(cxx)
    for cxx_name, cc_name in (("clang++", "clang"), ("g++", "gcc"), ("c++", "cc")):
        if cxx_name in name:
            candidate = os.path.join(os.path.dirname(cxx), name.replace(cxx_name, cc_name))
            if os.access(candidate, os.X_OK):
                return candidate, cxx
    return None, cxx


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="the checkout (holds conanfile.py)")
    parser.add_argument("--work", required=True, help="scratch dir under the build tree")
    parser.add_argument("--cxx", required=True, help="the build's C++ compiler")
    parser.add_argument("--generator", required=True, help="the build's CMake generator")
    parser.add_argument("--conan-version", required=True, help="the pinned conan version on PyPI")
    parser.add_argument("--version", required=True, help="gradcomp's CMake project version")
    parser.add_argument("--components", default="", help="comma-separated enabled components")
    args = parser.parse_args()

    components = [c for c in args.components.split(",") if c]
    recipes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes")
    os.makedirs(args.work, exist_ok=True)
    started = time.monotonic()
    timings = []

    def step(name, since):
        timings.append((name, time.monotonic() - since))
        return time.monotonic()

    t = time.monotonic()
    conan = install_conan(os.path.join(args.work, "venv"), args.conan_version)
    t = step("install conan", t)

    home = os.path.join(args.work, "conan_home")
    shutil.rmtree(home, ignore_errors=True)
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("CONAN_"):
            del env[key]
    env["CONAN_HOME"] = home
    cc, cxx = compilers(args.cxx)
    env["CXX"] = cxx
    if cc:
        env["CC"] = cc
    code, _ = run([conan, "profile", "detect", "--force"], env=env)
    if code != 0:
        raise Failure("`conan profile detect` failed (output above)")
    # Conan Center cannot be reached from the test machines: nothing may come from it.
    remotes = run_json([conan, "remote", "list", "--format=json"], env)
    if remotes is None:
        raise Failure("`conan remote list` failed (output above)")
    for remote in remotes:
        code, _ = run([conan, "remote", "remove", remote["name"]], env=env)
        if code != 0:
            raise Failure(f"`conan remote remove {remote['name']}` failed (output above)")
    t = step("CONAN_HOME + profile", t)

    wanted = ["system_fixture", "eigen"] + [dep for comp, dep in (("simd", "xsimd"), ("thrust", "thrust"), ("mpi", "openmpi"))
                          if comp in components]
    for name in wanted:
        code, _ = run([conan, "export", os.path.join(recipes, name)], env=env)
        if code != 0:
            raise Failure(f"`conan export` of the {name} fixture failed (output above): "
                          "is its Debian package installed? (scripts/install-deps.sh)")
    t = step("export fixtures", t)

    test_folder = os.path.join(args.work, "test_package")
    shutil.rmtree(test_folder, ignore_errors=True)
    shutil.copytree(os.path.join(args.source, "test_package"), test_folder,
                    ignore=shutil.ignore_patterns("build", "CMakeUserPresets.json"))
    options = []
    for comp in ("simd", "thrust", "mpi"):
        options += ["-o", f"gradcomp/*:with_{comp}={comp in components}"]
    confs = ["-c", f"tools.build:compiler_executables={json.dumps({k: v for k, v in (('c', cc), ('cpp', cxx)) if v})}",
             "-c", "tools.build:jobs=2"]
    if "Ninja" in args.generator:
        confs += ["-c", f"tools.cmake.cmaketoolchain:generator={args.generator}"]
    readme_args = readme_conan_command(args.source)
    command = ([conan, "create", args.source, "--test-folder", test_folder] + readme_args + options + confs
               + ["--build=missing"])
    code, out = run(command, env=env, capture=True)
    t = step("conan create + test_package", t)
    if code != 0:
        hint = ""
        if re.search(r"not resolved|Version range .* could not be resolved|Unable to find", out):
            hint = (": a requirement of conanfile.py is not met by the fixtures in tests/consumer/conan/recipes, "
                    "which have the versions of the installed Debian packages (see docs/packaging.md)")
        raise Failure(f"`conan create` exited with {code} (its output above){hint}")

    expected = [r"gradcomp: \d+ floats, \d+ bytes on the wire, decode_add ok"]
    if "thrust" in components:
        expected.append(r"thrust \(device system \d+\): sum 11\.25")
    if "mpi" in components:
        expected.append(r"MPI [3-9]\.\d+")
    missing = [pattern for pattern in expected if not re.search(pattern, out)]
    if missing:
        raise Failure("test_package did not print " + ", ".join(f"/{m}/" for m in missing)
                      + ": it did not run, or a check failed")
    for comp in ("simd", "thrust", "mpi"):
        linked = re.search(rf"test_package: linking gradcomp::{comp}\b", out) is not None
        if linked != (comp in components):
            raise Failure(f"test_package {'linked' if linked else 'did not link'} gradcomp::{comp}, but this "
                          f"build has with_{comp}={comp in components} (test_package's CMake output above)")

    listing = run_json([conan, "list", "gradcomp/*", "--format=json"], env)
    refs = list((listing or {}).get("Local Cache", {}))
    if refs != [f"gradcomp/{args.version}"]:
        raise Failure(f"the cache should hold gradcomp/{args.version} (CMake's project version), holds {refs}")

    step("total", started)
    log("passed: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Skip as skip:
        log(f"SKIPPED: {skip}")
        sys.exit(SKIP)
    except Failure as failure:
        log(f"FAILED: {failure}")
        sys.exit(1)
