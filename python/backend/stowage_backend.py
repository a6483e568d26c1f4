"""PEP 517 build backend of the stowage Python package (python/pyproject.toml).

build_wheel runs CMake on the Stowage checkout above this folder, builds
libstowage.so and, when jemalloc is there, the stowage command-line tool, and
writes a wheel of the pure-Python package with both inside it:

    stowage/libstowage.so   the library, loaded by stowage._lib before any other
    stowage/bin/stowage     the tool that `python -m stowage` and the `stowage`
                            console script run

The wheel is tagged py3-none-<platform>: the package is ctypes over a C library,
so it fits every Python 3 of that platform. Only the standard library is used
(zipfile, hashlib, subprocess), so that a build needs nothing from an index.
There is no sdist: the package is built from a checkout (the C sources sit
beside python/, not under it).

config_settings (pip -C KEY=VALUE):
    build-dir   a CMake build folder to configure and build in, and keep
                (default: a temporary one, removed afterwards)
    cmake-args  extra arguments for the CMake configure step, space-separated
"""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PY_ROOT = os.path.dirname(HERE)             # python/
REPO = os.path.dirname(PY_ROOT)             # the checkout
PACKAGE = os.path.join(PY_ROOT, "stowage")

METADATA = {
    "Name": "stowage",
    "Summary": "GPU memory allocator with built-in accounting, for PyTorch (ctypes over "
               "libstowage.so)",
    "License": "MIT",
    "Requires-Python": ">=3.8",
    "Classifier": [
        "License :: OSI Approved :: MIT License",
        "Programming Language :: Python :: 3",
        "Programming Language :: C",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
}
ENTRY_POINTS = "[console_scripts]\nstowage = stowage.__main__:main\n"


class BuildError(RuntimeError):
    pass


def _version():
    """The version of CMakeLists.txt's project() line: one source for C and Python."""
    path = os.path.join(REPO, "CMakeLists.txt")
    try:
        with open(path) as f:
            m = re.search(r"^project\(stowage VERSION ([0-9]+\.[0-9]+\.[0-9]+)", f.read(), re.M)
    except OSError as exc:
        raise BuildError("%s: %s (python/ must be built from a Stowage checkout)" % (path, exc))
    if not m:
        raise BuildError("%s: no 'project(stowage VERSION X.Y.Z' line" % path)
    return m.group(1)


def _tag():
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-" + plat


def _run(cmd, log):
    log.write("+ %s\n" % " ".join(cmd))
    log.flush()
    r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise BuildError("%s exited %d (output above)" % (cmd[0], r.returncode))


def _have_jemalloc():
    if shutil.which("pkg-config") is None:
        return False
    return subprocess.run(["pkg-config", "--exists", "jemalloc"]).returncode == 0


def _cmake_build(build_dir, extra_args, log):
    """Configures and builds; returns (path of the library, path of the tool or None)."""
    if shutil.which("cmake") is None:
        raise BuildError("cmake not found: the package builds libstowage.so with CMake "
                         "(Debian: apt-get install cmake gcc)")
    tools = _have_jemalloc()
    if not tools:
        log.write("stowage: jemalloc not found (pkg-config jemalloc): the wheel carries the "
                  "library without the stowage tool\n")
    configure = ["cmake", "-S", REPO, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                 "-DSTOW_BUILD_TESTS=OFF", "-DSTOW_WITH_TOOLS=%s" % ("ON" if tools else "OFF")]
    _run(configure + list(extra_args), log)
    targets = ["stowage"] + (["stowage_cli"] if tools else [])
    jobs = str(max(1, os.cpu_count() or 1))
    _run(["cmake", "--build", build_dir, "-j", jobs, "--target"] + targets, log)
    lib = os.path.realpath(os.path.join(build_dir, "libstowage.so"))
    cli = os.path.join(build_dir, "stowage") if tools else None
    for p in [lib] + ([cli] if cli else []):
        if not os.path.isfile(p):
            raise BuildError("the build made no %s" % p)
    return lib, cli


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


class _Wheel:
    """A wheel written entry by entry, its RECORD last."""

    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.records = []

    def add(self, arcname, data, executable=False):
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = (0o100755 if executable else 0o100644) << 16
        self.zip.writestr(info, data)
        self.records.append("%s,%s,%d" % (arcname, _record_hash(data), len(data)))

    def close(self, record_name):
        self.records.append("%s,," % record_name)
        info = zipfile.ZipInfo(record_name, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o100644 << 16
        self.zip.writestr(info, "\n".join(self.records) + "\n")
        self.zip.close()


def _metadata_text(version):
    lines = ["Metadata-Version: 2.1", "Name: %s" % METADATA["Name"], "Version: %s" % version]
    for key in ("Summary", "License", "Requires-Python"):
        lines.append("%s: %s" % (key, METADATA[key]))
    lines += ["Classifier: %s" % c for c in METADATA["Classifier"]]
    lines.append("License-File: LICENSE")
    return "\n".join(lines) + "\n"


def _package_files():
    """(arcname, path) of the package's Python files and the C source that `stowage predict`
    compiles at first use (fake_cuda.c); no caches, no built library."""
    out = []
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py") or name == "fake_cuda.c":
            out.append(("stowage/" + name, os.path.join(PACKAGE, name)))
    return out


def _read(path):
    with open(path, "rb") as f:
        return f.read()


# ---- PEP 517 hooks ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    del metadata_directory
    settings = config_settings or {}
    version = _version()
    keep = settings.get("build-dir")
    build_dir = os.path.abspath(keep) if keep else tempfile.mkdtemp(prefix="stowage-build-")
    extra = settings.get("cmake-args", "")
    extra = extra.split() if isinstance(extra, str) else list(extra)
    try:
        lib, cli = _cmake_build(build_dir, extra, sys.stderr)
        dist = "stowage-%s" % version
        name = "%s-%s.whl" % (dist, _tag())
        os.makedirs(wheel_directory, exist_ok=True)
        wheel = _Wheel(os.path.join(wheel_directory, name))
        for arcname, path in _package_files():
            wheel.add(arcname, _read(path))
        wheel.add("stowage/libstowage.so", _read(lib))
        if cli:
            wheel.add("stowage/bin/stowage", _read(cli), executable=True)
        info = dist + ".dist-info"
        wheel.add(info + "/METADATA", _metadata_text(version).encode())
        wheel.add(info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: stowage_backend\n"
                                    "Root-Is-Purelib: false\nTag: %s\n" % _tag()).encode())
        wheel.add(info + "/entry_points.txt", ENTRY_POINTS.encode())
        wheel.add(info + "/top_level.txt", b"stowage\n")
        wheel.add(info + "/LICENSE", _read(os.path.join(REPO, "LICENSE")))
        wheel.close(info + "/RECORD")
        return name
    finally:
        if not keep:
            shutil.rmtree(build_dir, ignore_errors=True)
