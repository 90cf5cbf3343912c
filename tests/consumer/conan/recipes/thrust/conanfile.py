"""TEST FIXTURE, not a Conan Center recipe: Debian's libthrust-dev as the Conan
package thrust/<installed version>.

Used only by gradcomp's ctest packaging.conan (tests/consumer/conan/run_conan.py),
which exports it into a throw-away CONAN_HOME because Conan Center cannot be
reached from the machines that run the tests. It packages nothing: package_info()
points at the installed headers, and the version is the one thrust/version.h
declares. Like Conan Center's thrust recipe it has the option device_system and
defines THRUST_DEVICE_SYSTEM from it; only the CPU systems that need no other
package (omp: OpenMP from the compiler, cpp) are accepted. Conan Center's recipe
requires cub and, for tbb, onetbb; Debian's Thrust 1.17 carries what the CPU
systems need.
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.system.package_manager import Apt

_CANDIDATES = ("/usr/include", "/usr/local/include")
_VERSION_HEADER = os.path.join("thrust", "version.h")


def _include_dir():
    for candidate in _CANDIDATES:
        if os.path.isfile(os.path.join(candidate, _VERSION_HEADER)):
            return candidate
    return None


class ThrustSystemFixture(ConanFile):
    name = "thrust"
    description = "Test fixture: the system's Thrust headers (Debian: libthrust-dev)"
    license = "Apache-2.0"
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"device_system": ["cuda", "cpp", "omp", "tbb"]}
    default_options = {"device_system": "tbb"}  # as Conan Center's recipe

    def set_version(self):
        if self.version:
            return
        include_dir = _include_dir()
        if include_dir is None:
            raise ConanInvalidConfiguration(
                f"thrust fixture: no {_VERSION_HEADER} in {', '.join(_CANDIDATES)} "
                "(Debian: apt-get install libthrust-dev)")
        with open(os.path.join(include_dir, _VERSION_HEADER)) as header:
            number = int(re.search(r"#define\s+THRUST_VERSION\s+(\d+)", header.read()).group(1))
        self.version = f"{number // 100000}.{number // 100 % 1000}.{number % 100}"

    def validate(self):
        if str(self.options.device_system) not in ("omp", "cpp"):
            raise ConanInvalidConfiguration(
                f"thrust fixture: device_system={self.options.device_system} is not provided "
                "(this test fixture wraps Debian's Thrust for the omp and cpp systems only)")

    def system_requirements(self):
        Apt(self).install(["libthrust-dev"])  # a check under Conan's default mode

    def package_id(self):
        self.info.clear()

    def package(self):
        pass  # nothing to package: the headers stay where Debian put them

    def package_info(self):
        self.cpp_info.includedirs = [_include_dir()]
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        system = str(self.options.device_system).upper()
        self.cpp_info.defines = [f"THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_{system}",
                                 "THRUST_IGNORE_CUB_VERSION_CHECK=1"]
