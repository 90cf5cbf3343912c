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
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.system.package_manager import Apt

_CANDIDATES = ("/usr/include", "/usr/local/include")
_CONFIG = os.path.join("xsimd", "config", "xsimd_config.hpp")


def _include_dir():
    for candidate in _CANDIDATES:
        if os.path.isfile(os.path.join(candidate, _CONFIG)):
            return candidate
    return None


class XsimdSystemFixture(ConanFile):
    name = "xsimd"
    description = "Test fixture: the system's xsimd headers (Debian: libxsimd-dev)"
    license = "BSD-3-Clause"
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"

    def set_version(self):
        if self.version:
            return
        include_dir = _include_dir()
        if include_dir is None:
            raise ConanInvalidConfiguration(
                f"xsimd fixture: no {_CONFIG} in {', '.join(_CANDIDATES)} (Debian: apt-get install libxsimd-dev)")
        with open(os.path.join(include_dir, _CONFIG)) as header:
            text = header.read()
        parts = [re.search(rf"#define\s+XSIMD_VERSION_{part}\s+(\d+)", text).group(1)
                 for part in ("MAJOR", "MINOR", "PATCH")]
        self.version = ".".join(parts)

    def system_requirements(self):
        Apt(self).install(["libxsimd-dev"])  # a check under Conan's default mode

    def package_id(self):
        self.info.clear()

    def package(self):
        pass  # nothing to package: the headers stay where Debian put them

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "xsimd")
        self.cpp_info.set_property("cmake_target_name", "xsimd")
        self.cpp_info.set_property("pkg_config_name", "xsimd")
        # /usr/include is the compiler's own search path: CMake drops it from the
        # command line, so it is named here for other generators only.
        self.cpp_info.includedirs = [_include_dir()]
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
