"""TEST FIXTURE, not a Conan Center recipe: Debian's libxsimd-dev as the Conan
package xsimd/<installed version>.

Used only by gradcomp's ctest packaging.conan (tests/consumer/conan/run_conan.py),
which exports it into a throw-away CONAN_HOME because Conan Center cannot be
reached from the machines that run the tests. It packages nothing: package_info()
points at the installed headers, and the version is the one they declare
(xsimd/config/xsimd_config.hpp). The consumer-facing names (CMake file xsimd,
target xsimd) are those of Conan Center's xsimd recipe; its xtl_complex option
is not modelled (gradcomp does not use it).
"""
from conan import ConanFile


class XsimdSystemFixture(ConanFile):
    name = "xsimd"
    description = "Test fixture: the system's xsimd headers (Debian: libxsimd-dev)"
    license = "BSD-3-Clause"
    python_requires = "gradcomp_system_fixture/1.0"  # recipes/system_fixture, exported first
    python_requires_extend = "gradcomp_system_fixture.SystemHeaderFixture"
    apt_packages = ("libxsimd-dev",)
    version_header = "xsimd/config/xsimd_config.hpp"
    # /usr/include is the compiler's own search path: CMake drops it from the
    # command line, so package_info() names it for other generators only.
    consumer_names = {"cmake_file_name": "xsimd", "cmake_target_name": "xsimd", "pkg_config_name": "xsimd"}

    def version_from(self, text):
        return ".".join(self.defined_numbers(text, r"#define\s+XSIMD_VERSION_{}\s+(\d+)", ("MAJOR", "MINOR", "PATCH")))
