"""TEST FIXTURE, not a Conan Center recipe: Debian's libeigen3-dev as the
Conan package eigen/<installed version>.

Used only by gradcomp's ctest packaging.conan (tests/consumer/conan/run_conan.py),
which exports it into a throw-away CONAN_HOME because Conan Center cannot be
reached from the machines that run the tests. It packages nothing: package_info()
points at the headers the Debian package installed, and the version is the one
those headers declare, so a requirement the installed Eigen does not satisfy
fails the resolution instead of being papered over. The consumer-facing names
(CMake file Eigen3, target Eigen3::Eigen, pkg-config eigen3, libm) are those of
Conan Center's eigen recipe.
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.system.package_manager import Apt

_CANDIDATES = ("/usr/include/eigen3", "/usr/local/include/eigen3")


def _include_dir():
    for candidate in _CANDIDATES:
        if os.path.isfile(os.path.join(candidate, "Eigen", "src", "Core", "util", "Macros.h")):
            return candidate
    return None


class EigenSystemFixture(ConanFile):
    name = "eigen"
    description = "Test fixture: the system's Eigen 3 headers (Debian: libeigen3-dev)"
    license = "MPL-2.0"
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"

    def set_version(self):
        if self.version:
            return
        include_dir = _include_dir()
        if include_dir is None:
            raise ConanInvalidConfiguration(
                f"eigen fixture: no Eigen headers in {', '.join(_CANDIDATES)} "
                "(Debian: apt-get install libeigen3-dev)")
        with open(os.path.join(include_dir, "Eigen", "src", "Core", "util", "Macros.h")) as header:
            text = header.read()
        parts = [re.search(rf"#define\s+EIGEN_{part}_VERSION\s+(\d+)", text).group(1)
                 for part in ("WORLD", "MAJOR", "MINOR")]
        self.version = ".".join(parts)

    def system_requirements(self):
        # Checks (never installs, under Conan's default package_manager mode) that
        # the Debian package is there.
        Apt(self).install(["libeigen3-dev"])

    def package_id(self):
        self.info.clear()

    def package(self):
        pass  # nothing to package: the headers stay where Debian put them

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "Eigen3")
        self.cpp_info.set_property("cmake_target_name", "Eigen3::Eigen")
        self.cpp_info.set_property("pkg_config_name", "eigen3")
        self.cpp_info.includedirs = [_include_dir()]
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["m"]
