import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load, rmdir
from conan.tools.scm import Version

required_conan_version = ">=2.0"


class GradcompConan(ConanFile):
    """Conan 2 recipe of gradcomp, a header-only library.

    The options map one to one onto the CMake options of the same backend
    (with_simd -> GRADCOMP_WITH_SIMD, ...) and onto the targets
    gradcomp::simd, gradcomp::thrust, gradcomp::mpi. Keep them in step with
    CMakeLists.txt, cmake/GradcompTargets.cmake and ports/gradcomp/.
    """

    name = "gradcomp"
    description = ("Header-only C++20 gradient-compression codecs (GradiVeQ, DGS + SAMomentum, "
                   "two-bit, QSGD, LGC) and transport-agnostic ring / parameter-server drivers")
    topics = ("gradient-compression", "distributed-training", "allreduce", "header-only")
    # No license file has been chosen for the project yet; package() copies one when it exists.
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {
        "with_simd": [True, False],
        "with_thrust": [True, False],
        "with_mpi": [True, False],
    }
    default_options = {
        "with_simd": True,
        "with_thrust": False,
        "with_mpi": False,
        # gradcomp::thrust runs Thrust's algorithms on the CPU with OpenMP.
        "thrust/*:device_system": "omp",
    }
    exports_sources = "CMakeLists.txt", "cmake/*", "include/*", "LICENSE*"
    no_copy_source = True

    # The CMake options each recipe option drives.
    _cmake_options = {
        "with_simd": "GRADCOMP_WITH_SIMD",
        "with_thrust": "GRADCOMP_WITH_THRUST",
        "with_mpi": "GRADCOMP_WITH_MPI",
    }

    @property
    def _min_cppstd(self):
        return 20

    @property
    def _compilers_minimum_version(self):
        # C++20 concepts, <span>, <bit>.
        return {"gcc": "11", "clang": "14", "apple-clang": "14", "msvc": "193", "Visual Studio": "17"}

    def set_version(self):
        # The single source of the version is project(gradcomp VERSION ...) in CMakeLists.txt.
        if not self.version:
            cmakelists = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
            self.version = re.search(r"project\(\s*gradcomp\s+VERSION\s+([0-9.]+)", cmakelists).group(1)

    def layout(self):
        cmake_layout(self, src_folder=".")

    def requirements(self):
        self.requires("eigen/3.4.0")
        if self.options.with_simd:
            self.requires("xsimd/8.1.0")
        if self.options.with_thrust:
            self.requires("thrust/1.17.2")
        if self.options.with_mpi:
            # The Open MPI 4.1 series (gradcomp uses the MPI-3 C API only): Conan
            # Center's 4.1.6, and Debian 12's 4.1.4 that the ctest packaging.conan uses.
            self.requires("openmpi/[>=4.1 <5]")

    def package_id(self):
        # Header-only: one package whatever the settings and options (the
        # options only choose requirements and cpp_info components).
        self.info.clear()

    def validate(self):
        if self.settings.compiler.get_safe("cppstd"):
            check_min_cppstd(self, self._min_cppstd)
        minimum = self._compilers_minimum_version.get(str(self.settings.compiler))
        if minimum and Version(self.settings.compiler.version) < minimum:
            raise ConanInvalidConfiguration(
                f"{self.ref} needs C++{self._min_cppstd}: {self.settings.compiler} >= {minimum}")
        if self.options.with_thrust and str(self.dependencies["thrust"].options.device_system) != "omp":
            raise ConanInvalidConfiguration(
                "gradcomp::thrust runs on the CPU with OpenMP: use -o 'thrust/*:device_system=omp'")

    def generate(self):
        tc = CMakeToolchain(self)
        for option, cmake_option in self._cmake_options.items():
            tc.cache_variables[cmake_option] = bool(self.options.get_safe(option))
        tc.cache_variables["GRADCOMP_BUILD_TESTS"] = False
        tc.cache_variables["GRADCOMP_BUILD_BENCH"] = False
        tc.cache_variables["GRADCOMP_BUILD_EXAMPLES"] = False
        tc.cache_variables["GRADCOMP_BUILD_FUZZERS"] = False
        tc.cache_variables["GRADCOMP_INSTALL"] = True
        tc.generate()
        CMakeDeps(self).generate()

    def build(self):
        # Nothing to compile. Configuring checks that the dependencies of the
        # chosen components are found the way gradcomp's CMake looks for them.
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        copy(self, "LICENSE*", src=self.source_folder, dst=os.path.join(self.package_folder, "licenses"))
        cmake = CMake(self)
        cmake.install()
        # CMakeDeps writes the consumer's gradcomp-config.cmake from package_info();
        # the installed one would describe the options of the first build only.
        rmdir(self, os.path.join(self.package_folder, "share"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "gradcomp")
        # The aggregate of every enabled component; the core keeps gradcomp::gradcomp.
        self.cpp_info.set_property("cmake_target_name", "gradcomp::all")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []

        core = self.cpp_info.components["core"]
        core.set_property("cmake_target_name", "gradcomp::gradcomp")
        core.bindirs = []
        core.libdirs = []
        core.requires = ["eigen::eigen"]
        if self.settings.os in ("Linux", "FreeBSD"):
            core.system_libs = ["pthread"]

        if self.options.with_simd:
            simd = self.cpp_info.components["simd"]
            simd.set_property("cmake_target_name", "gradcomp::simd")
            simd.bindirs = []
            simd.libdirs = []
            simd.requires = ["core", "xsimd::xsimd"]
            simd.defines = ["GRADCOMP_HAS_XSIMD=1"]

        if self.options.with_thrust:
            thrust = self.cpp_info.components["thrust"]
            thrust.set_property("cmake_target_name", "gradcomp::thrust")
            thrust.bindirs = []
            thrust.libdirs = []
            thrust.requires = ["core", "thrust::thrust"]
            thrust.defines = ["GRADCOMP_HAS_THRUST=1",
                              "THRUST_HOST_SYSTEM=THRUST_HOST_SYSTEM_CPP",
                              "THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP"]
            # OpenMP comes from the compiler (Conan Center has no OpenMP package).
            if str(self.settings.compiler) in ("gcc", "clang", "apple-clang"):
                thrust.cxxflags = ["-fopenmp"]
                thrust.exelinkflags = ["-fopenmp"]
                thrust.sharedlinkflags = ["-fopenmp"]
            elif str(self.settings.compiler) == "msvc":
                thrust.cxxflags = ["/openmp"]

        if self.options.with_mpi:
            mpi = self.cpp_info.components["mpi"]
            mpi.set_property("cmake_target_name", "gradcomp::mpi")
            mpi.bindirs = []
            mpi.libdirs = []
            # gradcomp uses the MPI C API (openmpi's "ompi-c" component: MPI::MPI_C).
            mpi.requires = ["core", "openmpi::ompi-c"]
            # C API only: <mpi.h> must not pull in the MPI-2 C++ bindings (libmpi_cxx).
            mpi.defines = ["GRADCOMP_HAS_MPI=1", "OMPI_SKIP_MPICXX=1", "MPICH_SKIP_MPICXX=1"]
