"""TEST FIXTURE, not a Conan Center recipe: the python_requires base of the
fixtures in tests/consumer/conan/recipes/ (eigen, xsimd, thrust, openmpi), which
wrap Debian's installed packages as Conan packages at the versions they declare.

Used only by gradcomp's ctest packaging.conan (tests/consumer/conan/run_conan.py),
which exports it before the fixtures into a throw-away CONAN_HOME. A fixture
names it with `python_requires = "gradcomp_system_fixture/1.0"` and extends one
of its classes (`python_requires_extend`):

- SystemPackageFixture: a package that Debian installed. The version is the one
  installed_version() reads from it; system_requirements() checks (never
  installs, under Conan's default package_manager mode) that the Debian
  packages `apt_packages` are there; nothing is packaged.
- SystemHeaderFixture: a header-only package found by its version header
  (`version_header`, relative to the first of `include_candidates` that holds
  it); version_from(text) reads the version from that header's text, and
  package_info() points at the include dir and gives the consumer-facing names
  `consumer_names` (CMake file and target, pkg-config name).
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.system.package_manager import Apt


class SystemPackageFixture:
    settings = "os", "arch", "compiler", "build_type"
    apt_packages = ()  # the Debian packages the fixture wraps

    def installed_version(self):
        raise NotImplementedError("a fixture reads its installed version")

    def set_version(self):
        if self.version:
            return
        self.version = self.installed_version()

    def system_requirements(self):
        # Checks (never installs, under Conan's default package_manager mode) that
        # the Debian packages are there.
        Apt(self).install(list(self.apt_packages))

    def package(self):
        pass  # nothing to package: the files stay where Debian put them

    def missing(self, what):
        return ConanInvalidConfiguration(
            f"{self.name} fixture: {what} (Debian: apt-get install {' '.join(self.apt_packages)})")


class SystemHeaderFixture(SystemPackageFixture):
    package_type = "header-library"
    include_candidates = ("/usr/include", "/usr/local/include")
    version_header = None  # relative to the include dir
    version_header_description = None  # how the error names it (default: its path)
    consumer_names = {}  # set_property name -> value

    def include_dir(self):
        for candidate in self.include_candidates:
            if os.path.isfile(os.path.join(candidate, self.version_header)):
                return candidate
        return None

    def version_from(self, text):
        raise NotImplementedError("a header fixture reads its version from its version header")

    @staticmethod
    def defined_numbers(text, pattern, parts):
        """The numbers `pattern` (with {} for each of `parts`) finds in `text`, as strings."""
        return [re.search(pattern.format(part), text).group(1) for part in parts]

    def installed_version(self):
        include_dir = self.include_dir()
        if include_dir is None:
            raise self.missing(f"no {self.version_header_description or self.version_header} in "
                               f"{', '.join(self.include_candidates)}")
        with open(os.path.join(include_dir, self.version_header)) as header:
            return self.version_from(header.read())

    def package_id(self):
        self.info.clear()

    def package_info(self):
        for name, value in self.consumer_names.items():
            self.cpp_info.set_property(name, value)
        self.cpp_info.includedirs = [self.include_dir()]
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []


class SystemFixturePythonRequire(ConanFile):
    name = "gradcomp_system_fixture"
    version = "1.0"
    package_type = "python-require"
    description = "Test fixture base: Debian's installed packages as Conan packages"
