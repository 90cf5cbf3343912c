"""TEST FIXTURE, not a Conan Center recipe: Debian's Open MPI (libopenmpi-dev,
openmpi-bin) as the Conan package openmpi/<installed version>.

Used only by gradcomp's ctest packaging.conan (tests/consumer/conan/run_conan.py),
which exports it into a throw-away CONAN_HOME because Conan Center cannot be
reached from the machines that run the tests. It packages nothing: package_info()
asks the installed compiler wrapper (`mpicc --showme:incdirs/libdirs/libs`) where
the headers and libraries are, and the version is the one mpi.h declares
(OMPI_MAJOR/MINOR/RELEASE_VERSION). The consumer-facing names are those of Conan
Center's openmpi recipe: CMake file MPI, components ompi (libmpi) and ompi-c
(target MPI::MPI_C); its components for Open MPI's internal libraries (orte,
open-pal) and its Fortran and C++ bindings are not modelled.
"""
import os
import re
import shutil
import subprocess

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration


class OpenmpiSystemFixture(ConanFile):
    name = "openmpi"
    description = "Test fixture: the system's Open MPI (Debian: libopenmpi-dev, openmpi-bin)"
    license = "BSD-3-Clause"
    package_type = "shared-library"
    python_requires = "gradcomp_system_fixture/1.0"  # recipes/system_fixture, exported first
    python_requires_extend = "gradcomp_system_fixture.SystemPackageFixture"
    apt_packages = ("libopenmpi-dev", "openmpi-bin")

    def _showme(self, what):
        mpicc = shutil.which("mpicc")
        if mpicc is None:
            raise self.missing("no mpicc on PATH")
        return subprocess.run([mpicc, f"--showme:{what}"], check=True, capture_output=True,
                              text=True).stdout.split()

    def installed_version(self):
        for include_dir in self._showme("incdirs"):
            header = os.path.join(include_dir, "mpi.h")
            if os.path.isfile(header):
                with open(header) as f:
                    text = f.read()
                parts = [re.search(rf"#define\s+OMPI_{part}_VERSION\s+(\d+)", text)
                         for part in ("MAJOR", "MINOR", "RELEASE")]
                if all(parts):
                    return ".".join(p.group(1) for p in parts)
        raise ConanInvalidConfiguration("openmpi fixture: mpicc's include dirs hold no Open MPI mpi.h")

    def package_id(self):
        # The binaries are the system's: one package per OS/arch, whatever the compiler.
        del self.info.settings.compiler
        del self.info.settings.build_type

    def package_info(self):
        self.cpp_info.set_property("cmake_find_mode", "both")
        self.cpp_info.set_property("cmake_file_name", "MPI")
        self.cpp_info.set_property("pkg_config_name", "_ompi-do-not-use")

        ompi = self.cpp_info.components["ompi"]
        ompi.set_property("pkg_config_name", "ompi")
        ompi.includedirs = self._showme("incdirs")
        ompi.libdirs = self._showme("libdirs")
        ompi.libs = self._showme("libs")
        ompi.bindirs = []
        if self.settings.os in ("Linux", "FreeBSD"):
            ompi.system_libs = ["m", "dl", "pthread", "rt", "util"]
        ompi.cflags = ["-pthread"]

        ompi_c = self.cpp_info.components["ompi-c"]
        ompi_c.set_property("pkg_config_name", "ompi-c")
        ompi_c.set_property("cmake_target_name", "MPI::MPI_C")
        ompi_c.requires = ["ompi"]
        ompi_c.includedirs = []
        ompi_c.libdirs = []
        ompi_c.bindirs = []
