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
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration


class ThrustSystemFixture(ConanFile):
    name = "thrust"
    description = "Test fixture: the system's Thrust headers (Debian: libthrust-dev)"
    license = "Apache-2.0"
    python_requires = "gradcomp_system_fixture/1.0"  # recipes/system_fixture, exported first
    python_requires_extend = "gradcomp_system_fixture.SystemHeaderFixture"
    options = {"device_system": ["cuda", "cpp", "omp", "tbb"]}
    default_options = {"device_system": "tbb"}  # as Conan Center's recipe
    apt_packages = ("libthrust-dev",)
    version_header = "thrust/version.h"

    def version_from(self, text):
        number = int(re.search(r"#define\s+THRUST_VERSION\s+(\d+)", text).group(1))
        return f"{number // 100000}.{number // 100 % 1000}.{number % 100}"

    def validate(self):
        if str(self.options.device_system) not in ("omp", "cpp"):
            raise ConanInvalidConfiguration(
                f"thrust fixture: device_system={self.options.device_system} is not provided "
                "(this test fixture wraps Debian's Thrust for the omp and cpp systems only)")

    def package_info(self):
        super().package_info()
        system = str(self.options.device_system).upper()
        self.cpp_info.defines = [f"THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_{system}",
                                 "THRUST_IGNORE_CUB_VERSION_CHECK=1"]
