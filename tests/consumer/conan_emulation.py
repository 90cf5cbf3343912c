#!/usr/bin/env python3
"""Runs conanfile.py and test_package/ through the steps `conan create` takes,
with a small stand-in for the part of the Conan 2 API the two recipes use
(Conan itself cannot be installed on this machine).

What is real: the recipes' own code (set_version, requirements, validate,
package_id, generate, build, package, package_info; the test_package's
requirements, layout, build, test), CMake configuring gradcomp with exactly
the cache variables the recipe's generate() sets, `cmake --install` into the
package folder, the recipe's file copies and removals, and building and
running test_package against the package.

What is emulated: the Conan API objects (options, settings, CMake,
CMakeToolchain, cmake_layout, copy/rmdir/load, ...), and CMakeDeps. The
dependencies (eigen, xsimd, thrust, openmpi) come from the Debian packages,
described the way their Conan Center recipes' package_info() describes them
(file names, target names, components), and written out as CMakeDeps-style
config files; gradcomp's own consumer config is written from what the
recipe's package_info() declares. So a wrong target name, define, flag or
requirement in package_info() makes test_package fail to configure, compile
or link.

Usage: conan_emulation.py --source DIR --work DIR --cxx COMPILER
                          [--generator GEN] [-o with_simd=True ...]
"""
import argparse
import fnmatch
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types

sys.dont_write_bytecode = True  # do not leave __pycache__ next to the recipes

# ---------------------------------------------------------------------------
# The Conan 2 API surface the recipes use, as a throw-away `conan` package.

STUBS = {
    "conan/__init__.py": '''
        class ConanFile:
            """Attributes are filled in by conan_emulation.py."""
            name = None
            version = None
            settings = ()
            options = {}
            default_options = {}
            generators = ()
    ''',
    "conan/errors.py": '''
        class ConanException(Exception):
            pass
        class ConanInvalidConfiguration(ConanException):
            pass
    ''',
    "conan/tools/__init__.py": "",
    "conan/tools/build/__init__.py": '''
        from conan.errors import ConanInvalidConfiguration
        def check_min_cppstd(conanfile, cppstd, gnu_extensions=False):
            value = str(conanfile.settings.get_safe("compiler.cppstd") or "")
            if value and int(value.replace("gnu", "")) < int(cppstd):
                raise ConanInvalidConfiguration(f"needs C++{cppstd}, compiler.cppstd={value}")
        def can_run(conanfile):
            return True
    ''',
    "conan/tools/scm/__init__.py": '''
        class Version:
            def __init__(self, v):
                self.parts = [int(x) for x in str(v).split(".") if x.isdigit()]
            def _cmp(self, other):
                o = other if isinstance(other, Version) else Version(other)
                n = max(len(self.parts), len(o.parts))
                a = self.parts + [0] * (n - len(self.parts))
                b = o.parts + [0] * (n - len(o.parts))
                return (a > b) - (a < b)
            def __lt__(self, o): return self._cmp(o) < 0
            def __le__(self, o): return self._cmp(o) <= 0
            def __gt__(self, o): return self._cmp(o) > 0
            def __ge__(self, o): return self._cmp(o) >= 0
            def __eq__(self, o): return self._cmp(o) == 0
    ''',
    "conan/tools/files/__init__.py": '''
        import fnmatch, os, shutil
        def load(conanfile, path, encoding="utf-8"):
            with open(path, encoding=encoding) as f:
                return f.read()
        def copy(conanfile, pattern, src, dst, keep_path=True, excludes=None):
            copied = []
            for root, _, files in os.walk(src):
                for name in files:
                    rel = os.path.relpath(os.path.join(root, name), src)
                    if fnmatch.fnmatch(rel, pattern):
                        target = os.path.join(dst, rel if keep_path else name)
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        shutil.copy2(os.path.join(root, name), target)
                        copied.append(target)
            return copied
        def rmdir(conanfile, path):
            shutil.rmtree(path, ignore_errors=True)
    ''',
    "conan/tools/cmake/__init__.py": '''
        from conan_emulation_runtime import CMake, CMakeToolchain, CMakeDeps, cmake_layout
    ''',
}


class Value:
    """An option or setting value: compares as a string, is truthy like Conan's."""

    def __init__(self, value):
        self.value = None if value is None else str(value)

    def __bool__(self):
        return self.value is not None and self.value.lower() not in ("false", "0", "none", "off", "")

    def __eq__(self, other):
        return self.value == (other.value if isinstance(other, Value) else str(other))

    def __str__(self):
        return str(self.value)

    __hash__ = None


class Bag:
    """Attribute bag for options/settings with get_safe (dotted names)."""

    def __init__(self, values):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name):
        sub = {k[len(name) + 1:]: v for k, v in self._values.items() if k.startswith(name + ".")}
        if name in self._values and not sub:
            return Value(self._values[name])
        if name in self._values:
            return SettingWithSubs(self._values[name], sub)
        if sub:
            return Bag(sub)
        raise AttributeError(name)

    def get_safe(self, name, default=None):
        return Value(self._values[name]) if name in self._values else default

    def items(self):
        return self._values.items()


class SettingWithSubs(Value):
    def __init__(self, value, subs):
        super().__init__(value)
        self._subs = Bag(subs)

    def __getattr__(self, name):
        return getattr(self._subs, name)

    def get_safe(self, name, default=None):
        return self._subs.get_safe(name, default)


class Info:
    def __init__(self):
        self.cleared = False

    def clear(self):
        self.cleared = True


class Component:
    def __init__(self):
        self.properties = {}
        self.requires = []
        self.defines = []
        self.cxxflags = []
        self.exelinkflags = []
        self.sharedlinkflags = []
        self.system_libs = []
        self.libs = []
        self.includedirs = ["include"]
        self.libdirs = ["lib"]
        self.bindirs = ["bin"]

    def set_property(self, name, value):
        self.properties[name] = value

    def get_property(self, name):
        return self.properties.get(name)


class CppInfo(Component):
    def __init__(self):
        super().__init__()
        self.components = {}

    def __getattribute__(self, name):
        if name == "components":
            comps = object.__getattribute__(self, "components")
            return _AutoDict(comps)
        return object.__getattribute__(self, name)


class _AutoDict(dict):
    def __init__(self, backing):
        super().__init__()
        self._backing = backing

    def __getitem__(self, key):
        if key not in self._backing:
            self._backing[key] = Component()
        return self._backing[key]

    def items(self):
        return self._backing.items()

    def __contains__(self, key):
        return key in self._backing


class Folders:
    source = "."
    build = "."
    generators = "."


def run(cmd, cwd=None):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


# The runtime the `conan.tools.cmake` stub re-exports.
RUNTIME = types.ModuleType("conan_emulation_runtime")


class CMakeToolchain:
    def __init__(self, conanfile):
        self._conanfile = conanfile
        self.variables = {}
        self.cache_variables = {}
        self.preprocessor_definitions = {}

    def generate(self):
        cf = self._conanfile
        os.makedirs(cf.generators_folder, exist_ok=True)
        toolchain = os.path.join(cf.generators_folder, "conan_toolchain.cmake")
        with open(toolchain, "w") as f:
            # What Conan's toolchain does that matters here: generated configs first.
            f.write("set(CMAKE_FIND_PACKAGE_PREFER_CONFIG ON)\n")
            f.write(f'list(PREPEND CMAKE_PREFIX_PATH "{cf.generators_folder}")\n')
            f.write(f'list(PREPEND CMAKE_MODULE_PATH "{cf.generators_folder}")\n')
            # compiler.cppstd -> CMAKE_CXX_STANDARD, as Conan's toolchain does.
            cppstd = str(cf.settings.get_safe("compiler.cppstd") or "")
            if cppstd:
                f.write(f"set(CMAKE_CXX_STANDARD {cppstd.replace('gnu', '')})\n")
                f.write(f"set(CMAKE_CXX_EXTENSIONS {'ON' if cppstd.startswith('gnu') else 'OFF'})\n")
            for k, v in self.variables.items():
                f.write(f'set({k} "{v}")\n')
        with open(os.path.join(cf.generators_folder, "cache_variables.json"), "w") as f:
            json.dump(self.cache_variables, f, indent=1)
        cf._toolchain = self


class CMakeDeps:
    def __init__(self, conanfile):
        self._conanfile = conanfile

    def generate(self):
        # The emulation writes the dependencies' configs itself (write_deps_configs).
        self._conanfile._cmakedeps_generated = True


class CMake:
    def __init__(self, conanfile):
        self._cf = conanfile

    def configure(self, variables=None):
        cf = self._cf
        cache = {}
        cache_file = os.path.join(cf.generators_folder, "cache_variables.json")
        if os.path.exists(cache_file):
            with open(cache_file) as f:
                cache = json.load(f)
        cache.update(variables or {})
        cmd = [shutil.which("cmake"), "-S", cf.source_folder, "-B", cf.build_folder, "-G", cf._generator,
               f"-DCMAKE_TOOLCHAIN_FILE={os.path.join(cf.generators_folder, 'conan_toolchain.cmake')}",
               f"-DCMAKE_BUILD_TYPE={cf.settings.build_type}",
               f"-DCMAKE_CXX_COMPILER={cf._cxx}",
               f"-DCMAKE_INSTALL_PREFIX={cf.package_folder or os.path.join(cf.build_folder, 'install')}",
               "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"]
        for k, v in cache.items():
            if isinstance(v, bool):
                v = "ON" if v else "OFF"
            cmd.append(f"-D{k}={v}")
        run(cmd)

    def build(self, target=None):
        cmd = [shutil.which("cmake"), "--build", self._cf.build_folder, "-j", "2"]
        if target:
            cmd += ["--target", target]
        run(cmd)

    def install(self):
        run([shutil.which("cmake"), "--install", self._cf.build_folder, "--prefix", self._cf.package_folder])


def cmake_layout(conanfile, src_folder=".", build_folder="build"):
    build_type = str(conanfile.settings.build_type)
    conanfile.folders.source = src_folder
    conanfile.folders.build = os.path.join(build_folder, build_type)
    conanfile.folders.generators = os.path.join(build_folder, build_type, "generators")
    conanfile._bindir_rel = "."  # single-config generator


for _name, _obj in dict(CMake=CMake, CMakeToolchain=CMakeToolchain, CMakeDeps=CMakeDeps,
                        cmake_layout=cmake_layout).items():
    setattr(RUNTIME, _name, _obj)
sys.modules["conan_emulation_runtime"] = RUNTIME


def install_stubs(stub_dir):
    for rel, text in STUBS.items():
        path = os.path.join(stub_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
    sys.path.insert(0, stub_dir)


def load_recipe(path, module_name):
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from conan import ConanFile
    classes = [c for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, ConanFile) and c is not ConanFile]
    if len(classes) != 1:
        raise SystemExit(f"{path}: expected one ConanFile class, found {len(classes)}")
    return classes[0]


# ---------------------------------------------------------------------------
# The dependencies as Conan Center's recipes describe them, with Debian's files.

def mpi_dirs():
    inc = subprocess.run(["mpicc", "--showme:incdirs"], capture_output=True, text=True, check=True).stdout.split()
    lib = subprocess.run(["mpicc", "--showme:libdirs"], capture_output=True, text=True, check=True).stdout.split()
    return inc, lib


def conan_center_packages():
    mpi_inc, mpi_lib = mpi_dirs() if shutil.which("mpicc") else ([], [])
    return {
        # eigen: cmake_file_name Eigen3, target Eigen3::Eigen
        "eigen": dict(file="Eigen3", version="3.4.0", target="Eigen3::Eigen",
                      includedirs=["/usr/include/eigen3"], components={}),
        # xsimd: cmake_target_name xsimd
        "xsimd": dict(file="xsimd", version="8.1.0", target="xsimd", includedirs=["/usr/include"], components={}),
        # thrust: defaults (thrust-config.cmake, thrust::thrust), define from option device_system
        "thrust": dict(file="thrust", version="1.17.2", target="thrust::thrust", includedirs=["/usr/include"],
                       defines=["THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP"], components={}),
        # openmpi: cmake_file_name MPI, component ompi-c -> MPI::MPI_C (MPI::MPI_CXX only with enable_cxx)
        "openmpi": dict(file="MPI", version="4.1.6", target="openmpi::openmpi", components={
            "ompi-c": dict(target="MPI::MPI_C", includedirs=mpi_inc, libdirs=mpi_lib, libs=["mpi"])}),
    }


def cmake_list(items):
    return " ".join(f'"{i}"' for i in items)


def write_config(folder, file_name, version, body, find_dependencies=()):
    """A CMakeDeps-like <file>-config.cmake / <File>Config.cmake plus its version file."""
    lower = file_name == file_name.lower()
    config = os.path.join(folder, f"{file_name}-config.cmake" if lower else f"{file_name}Config.cmake")
    version_file = os.path.join(folder, f"{file_name}-config-version.cmake" if lower
                                else f"{file_name}ConfigVersion.cmake")
    with open(config, "w") as f:
        f.write("# Written by tests/consumer/conan_emulation.py in the manner of Conan's CMakeDeps\n")
        f.write("include_guard()\ninclude(CMakeFindDependencyMacro)\n")
        for dep in find_dependencies:
            f.write(f"find_dependency({dep} REQUIRED NO_MODULE)\n")
        f.write(body)
    major = version.split(".")[0]
    with open(version_file, "w") as f:
        f.write(textwrap.dedent(f'''\
            set(PACKAGE_VERSION "{version}")
            if(PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION)
              set(PACKAGE_VERSION_COMPATIBLE FALSE)
            elseif("{major}" STREQUAL PACKAGE_FIND_VERSION_MAJOR OR NOT PACKAGE_FIND_VERSION)
              set(PACKAGE_VERSION_COMPATIBLE TRUE)
              if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
                set(PACKAGE_VERSION_EXACT TRUE)
              endif()
            else()
              set(PACKAGE_VERSION_COMPATIBLE FALSE)
            endif()
            '''))


def target_block(target, includedirs=(), defines=(), cxxflags=(), linkflags=(), links=()):
    out = [f"if(NOT TARGET {target})\n  add_library({target} INTERFACE IMPORTED)\nendif()\n"]
    if includedirs:
        out.append(f"set_property(TARGET {target} APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES {cmake_list(includedirs)})\n")
    if defines:
        out.append(f"set_property(TARGET {target} APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS {cmake_list(defines)})\n")
    if cxxflags:
        out.append(f"set_property(TARGET {target} APPEND PROPERTY INTERFACE_COMPILE_OPTIONS {cmake_list(cxxflags)})\n")
    if linkflags:
        out.append(f"set_property(TARGET {target} APPEND PROPERTY INTERFACE_LINK_OPTIONS {cmake_list(linkflags)})\n")
    if links:
        out.append(f"set_property(TARGET {target} APPEND PROPERTY INTERFACE_LINK_LIBRARIES {cmake_list(links)})\n")
    return "".join(out)


def find_lib(name, libdirs):
    for d in libdirs:
        for candidate in (f"lib{name}.so", f"lib{name}.a"):
            if os.path.exists(os.path.join(d, candidate)):
                return os.path.join(d, candidate)
    raise SystemExit(f"library {name} not found in {libdirs}")


def write_deps_configs(folder, requires):
    """The configs CMakeDeps would write for the recipe's requirements."""
    packages = conan_center_packages()
    os.makedirs(folder, exist_ok=True)
    for ref in requires:
        name, version = ref.split("/")
        pkg = packages[name]
        body = target_block(pkg["target"], pkg.get("includedirs", ()), pkg.get("defines", ()))
        for comp in pkg["components"].values():
            links = [find_lib(lib, comp.get("libdirs", ())) for lib in comp.get("libs", ())]
            body += target_block(comp["target"], comp.get("includedirs", ()), links=links)
            body += f"set_property(TARGET {pkg['target']} APPEND PROPERTY INTERFACE_LINK_LIBRARIES {comp['target']})\n"
        write_config(folder, pkg["file"], version, body)


def dependency_target(requirement, packages):
    """'eigen::eigen' -> Eigen3::Eigen; 'openmpi::ompi-c' -> MPI::MPI_C."""
    pkg_name, comp = requirement.split("::")
    pkg = packages[pkg_name]
    if comp == pkg_name:
        return pkg["target"]
    return pkg["components"][comp]["target"]


def write_package_config(folder, name, version, package_folder, cpp_info, requires, settings_os):
    """CMakeDeps' config for the package itself, from its package_info()."""
    packages = conan_center_packages()
    dep_files = [packages[r.split("/")[0]]["file"] for r in requires]
    root = cpp_info.get_property("cmake_target_name") or f"{name}::{name}"
    body = ""
    components = dict(cpp_info.components.items())
    done = set()

    def emit(comp_name):
        nonlocal body
        if comp_name in done:
            return
        comp = components[comp_name]
        links = []
        for req in comp.requires:
            if "::" in req:
                links.append(dependency_target(req, packages))
            else:
                emit(req)
                links.append(components[req].get_property("cmake_target_name") or f"{name}::{req}")
        links += comp.system_libs
        target = comp.get_property("cmake_target_name") or f"{name}::{comp_name}"
        includes = [os.path.join(package_folder, d) for d in comp.includedirs]
        body += target_block(target, includes, comp.defines, comp.cxxflags, comp.exelinkflags, links)
        done.add(comp_name)

    for comp_name in components:
        emit(comp_name)
    body += target_block(root, links=[components[c].get_property("cmake_target_name") or f"{name}::{c}"
                                      for c in components])
    write_config(folder, cpp_info.get_property("cmake_file_name") or name, version, body, dep_files)


# ---------------------------------------------------------------------------

def instantiate(cls, args, settings, folders_base, options=None, dep_options=None):
    cf = cls()
    cf.settings = Bag(settings)
    cf.options = Bag(options or {})
    cf.info = Info()
    cf.folders = Folders()
    cf.cpp = types.SimpleNamespace(build=types.SimpleNamespace(bindir=None))
    cf.cpp_info = CppInfo()
    cf.output = types.SimpleNamespace(info=print, warning=print, warn=print)
    cf.conf = Bag({})
    cf._generator = args.generator
    cf._cxx = args.cxx
    cf._base = folders_base
    cf.package_folder = None
    cf._requires = []
    cf.requires = lambda ref, **kw: cf._requires.append(ref)
    deps = {}
    for key, value in (dep_options or {}).items():
        pkg, opt = key.split("/*:")
        deps.setdefault(pkg, {})[opt] = value
    cf.dependencies = {pkg: types.SimpleNamespace(options=Bag(opts)) for pkg, opts in deps.items()}

    def run_cmd(command, env=None, cwd=None):
        run(command.split() if isinstance(command, str) else command, cwd=cwd)
    cf.run = run_cmd
    return cf


def set_folders(cf, source_folder):
    cf.source_folder = source_folder
    cf.build_folder = os.path.join(cf._base, cf.folders.build)
    cf.generators_folder = os.path.join(cf._base, cf.folders.generators)
    cf.cpp.build.bindir = os.path.join(cf.build_folder, getattr(cf, "_bindir_rel", "."))


def check(condition, message):
    if not condition:
        raise SystemExit(f"conan emulation: FAILED: {message}")
    print(f"conan emulation: ok: {message}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--cxx", required=True)
    parser.add_argument("--generator", default="Unix Makefiles")
    parser.add_argument("-o", dest="options", action="append", default=[])
    args = parser.parse_args()
    source = os.path.abspath(args.source)
    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    install_stubs(os.path.join(work, "stubs"))

    compiler = "clang" if "clang" in os.path.basename(args.cxx) else "gcc"
    compiler_version = subprocess.run([args.cxx, "-dumpversion"], capture_output=True, text=True,
                                      check=True).stdout.strip().split(".")[0]
    settings = {"os": "Linux", "arch": "x86_64", "compiler": compiler, "compiler.version": compiler_version,
                "compiler.cppstd": "20", "compiler.libcxx": "libstdc++11", "build_type": "Release"}

    # --- conan create: export ------------------------------------------------
    recipe_cls = load_recipe(os.path.join(source, "conanfile.py"), "gradcomp_recipe")
    export = os.path.join(work, "export")
    patterns = recipe_cls.exports_sources
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    for root, _, files in os.walk(source):
        rel_root = os.path.relpath(root, source)
        if rel_root.split(os.sep)[0].startswith(("build", ".git")):
            continue
        for fname in files:
            rel = os.path.normpath(os.path.join(rel_root, fname))
            if any(fnmatch.fnmatch(rel, p) for p in patterns):
                os.makedirs(os.path.join(export, os.path.dirname(rel)), exist_ok=True)
                shutil.copy2(os.path.join(root, fname), os.path.join(export, rel))
    recipe_cls.recipe_folder = source

    # Options: defaults, then -o overrides; "pkg/*:opt" entries are dependency options.
    defaults = dict(recipe_cls.default_options)
    for item in args.options:
        key, value = item.split("=", 1)
        defaults[key] = value
    own = {k: v for k, v in defaults.items() if "/*:" not in k}
    dep_opts = {k: v for k, v in defaults.items() if "/*:" in k}
    for key in own:
        check(key in recipe_cls.options, f"option {key} is declared")

    cf = instantiate(recipe_cls, args, settings, os.path.join(work, "create"), own, dep_opts)
    cf.recipe_folder = source
    cf.set_version()
    cmakelists = open(os.path.join(source, "CMakeLists.txt")).read()
    project_version = re.search(r"project\(\s*gradcomp\s+VERSION\s+([0-9.]+)", cmakelists).group(1)
    check(cf.version == project_version, f"recipe version {cf.version} == CMake project version")
    check(cf.package_type == "header-library", "package_type is header-library")

    # Every recipe option drives the CMake option of the same backend.
    cmake_options = set(re.findall(r"option\((GRADCOMP_\w+)", cmakelists))
    for option, cmake_option in recipe_cls._cmake_options.items():
        check(cmake_option in cmake_options, f"{option} -> {cmake_option} exists in CMakeLists.txt")
    check(set(recipe_cls._cmake_options) == set(recipe_cls.options), "every option maps to a CMake option")

    cf.layout()
    set_folders(cf, export)
    cf.package_folder = os.path.join(work, "package")
    cf.requirements()
    print("requires:", cf._requires)
    check(any(r.startswith("eigen/3.4") for r in cf._requires), "requires eigen/3.4.x")
    cf.package_id()
    check(cf.info.cleared, "package_id() clears the info (header-only)")
    cf.validate()

    write_deps_configs(cf.generators_folder, cf._requires)
    cf.generate()
    tc = cf._toolchain
    for option, cmake_option in recipe_cls._cmake_options.items():
        check(tc.cache_variables.get(cmake_option) == bool(cf.options.get_safe(option)),
              f"generate() sets {cmake_option}={tc.cache_variables.get(cmake_option)} from {option}")
    cf.build()
    cf.package()

    pkg = cf.package_folder
    check(os.path.exists(os.path.join(pkg, "include", "gradcomp", "gradcomp.hpp")), "headers are packaged")
    check(not os.path.exists(os.path.join(pkg, "share")), "gradcomp's own CMake config is removed (CMakeDeps)")
    check(not os.path.exists(os.path.join(pkg, "lib")), "no lib/ in a header-only package")

    cf.package_info()
    comps = dict(cf.cpp_info.components.items())
    check(comps["core"].get_property("cmake_target_name") == "gradcomp::gradcomp", "core -> gradcomp::gradcomp")
    targets_cmake = open(os.path.join(source, "cmake", "GradcompTargets.cmake")).read()
    for option in recipe_cls._cmake_options:
        component = option.replace("with_", "")
        enabled = bool(cf.options.get_safe(option))
        check((component in comps) == enabled, f"component {component} present iff {option}={enabled}")
        if enabled:
            check(comps[component].get_property("cmake_target_name") == f"gradcomp::{component}",
                  f"{component} -> gradcomp::{component}")
            defines = re.search(rf"target_compile_definitions\(gradcomp_{component} INTERFACE ([^)]+)\)",
                                targets_cmake).group(1).split()
            for define in defines:
                check(define in comps[component].defines, f"{component} defines {define} like the CMake target")

    # --- test_package --------------------------------------------------------
    test_cls = load_recipe(os.path.join(source, "test_package", "conanfile.py"), "gradcomp_test_package")
    tp = instantiate(test_cls, args, settings, os.path.join(work, "test_package"))
    tp.tested_reference_str = f"gradcomp/{cf.version}"
    tp.requirements()
    check(tp._requires == [tp.tested_reference_str], "test_package requires the tested reference")
    tp.layout()
    set_folders(tp, os.path.join(source, "test_package"))
    for generator in test_cls.generators:
        check(generator in ("CMakeDeps", "CMakeToolchain"), f"generator {generator} is emulated")
    write_deps_configs(tp.generators_folder, cf._requires)
    write_package_config(tp.generators_folder, "gradcomp", cf.version, pkg, cf.cpp_info, cf._requires,
                         settings["os"])
    CMakeToolchain(tp).generate()
    tp.build()
    tp.test()
    shutil.rmtree(work, ignore_errors=True)
    print("conan emulation: passed")


if __name__ == "__main__":
    main()
