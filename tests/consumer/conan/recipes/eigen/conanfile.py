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
from conan import ConanFile


class EigenSystemFixture(ConanFile):
    name = "eigen"
    description = "Test fixture: the system's Eigen 3 headers (Debian: libeigen3-dev)"
    license = "MPL-2.0"
    python_requires = "gradcomp_system_fixture/1.0"  # recipes/system_fixture, exported first
    python_requires_extend = "gradcomp_system_fixture.SystemHeaderFixture"
    apt_packages = ("libeigen3-dev",)
    include_candidates = ("/usr/include/eigen3", "/usr/local/include/eigen3")
    version_header = "Eigen/src/Core/util/Macros.h"
    version_header_description = "Eigen headers"
    consumer_names = {"cmake_file_name": "Eigen3", "cmake_target_name": "Eigen3::Eigen", "pkg_config_name": "eigen3"}

    def version_from(self, text):
        return ".".join(self.defined_numbers(text, r"#define\s+EIGEN_{}_VERSION\s+(\d+)", ("WORLD", "MAJOR", "MINOR")))

    def package_info(self):
        super().package_info()
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["m"]
