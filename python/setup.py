"""setup.py - builds and installs `import kiln`, the Python API of Kiln.

The package is the C extension kiln._kiln (python/kiln/_kiln.c, written
against libkiln's public API, include/kiln/kiln.h) plus the pure-Python
layer in python/kiln/__init__.py.

How the extension finds libkiln: it links against the libkiln.so of a CMake
build of this repository (KILN_BUILD_DIR, default <repo>/build; configured
and built here, target `kiln` only, when libkiln.so is missing), and that
libkiln.so is copied next to the extension with an rpath of $ORIGIN. The
installed package is therefore self-contained (it does not depend on the
build folder staying where it is), libkiln is compiled once by the same
CMake rules as the CLI and server (per-file ISA flags, generated protobuf
sources, oneDNN, OpenMP), and the extension stays a thin layer over the
public API, like the server.

    python3 -m pip install --no-build-isolation ./python   (Debian 12 adds
        --break-system-packages, or use a venv with --system-site-packages)
    python3 python/setup.py build_ext --inplace            (then PYTHONPATH=python)

Environment: KILN_BUILD_DIR (the CMake build folder), KILN_WERROR=1
(compile the extension with -Werror, as the tests do).
"""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VERSION = "0.1.0"  # KILN_VERSION_STRING in include/kiln/kiln.h


def kiln_build_dir():
    return os.path.abspath(os.environ.get("KILN_BUILD_DIR") or os.path.join(ROOT, "build"))


def ensure_libkiln(build_dir):
    """Return the path of libkiln.so, building it with CMake when missing."""
    lib = os.path.join(build_dir, "libkiln.so")
    if os.path.exists(lib):
        return lib
    print(f"kiln: {lib} is missing; building libkiln with CMake", file=sys.stderr)
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir,
                               "-DCMAKE_BUILD_TYPE=RelWithDebInfo"])
    subprocess.check_call(["cmake", "--build", build_dir, "--target", "kiln",
                           "-j", str(os.cpu_count() or 2)])
    return lib


class BuildExtWithLibkiln(build_ext):
    """build_ext that links against libkiln.so and puts a copy beside the extension."""

    def run(self):
        import numpy
        build_dir = kiln_build_dir()
        self.libkiln = ensure_libkiln(build_dir)
        for ext in self.extensions:
            ext.include_dirs += [os.path.join(ROOT, "include"), numpy.get_include()]
            ext.library_dirs.append(build_dir)
        super().run()
        dest = os.path.dirname(self.get_ext_fullpath("kiln._kiln"))
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(self.libkiln, os.path.join(dest, "libkiln.so"))
        # the extension records libkiln's SONAME (libkiln.so.0): copy under that name too
        for soname in glob.glob(os.path.join(build_dir, "libkiln.so.[0-9]*")):
            if soname.count(".") == 2:  # libkiln.so.N, not libkiln.so.N.M.P
                shutil.copy2(self.libkiln, os.path.join(dest, os.path.basename(soname)))


CFLAGS = ["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wshadow=local"]
if os.environ.get("KILN_WERROR") == "1":
    CFLAGS.append("-Werror")

setup(
    name="kiln",
    version=VERSION,
    description="Python API of Kiln, a model runtime (ONNX Runtime's InferenceSession shape)",
    packages=["kiln"],
    package_dir={"kiln": os.path.relpath(os.path.join(HERE, "kiln"))},
    package_data={"kiln": ["__init__.pyi", "py.typed"]},
    ext_modules=[Extension(
        "kiln._kiln",
        sources=[os.path.relpath(os.path.join(HERE, "kiln", "_kiln.c"))],
        libraries=["kiln"],
        extra_compile_args=CFLAGS,
        extra_link_args=["-Wl,-rpath,$ORIGIN"],
    )],
    cmdclass={"build_ext": BuildExtWithLibkiln},
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)
