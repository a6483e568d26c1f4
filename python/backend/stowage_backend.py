"""PEP 517 build backend of the stowage Python package (python/pyproject.toml).

build_wheel runs CMake on the Stowage checkout above this folder, builds
libstowage.so and, when jemalloc is there, the stowage command-line tool, and
writes a wheel of the pure-Python package with both inside it:

    stowage/libstowage.so   the library, loaded by stowage._lib before any other
    stowage/bin/stowage     the tool that `python -m stowage` and the `stowage`
                            console script run
    stowage/libstowage_torch.so
                            the C++ adapter (python/csrc/torch_allocator.cpp), when
                            torch is importable by the Python running the build and
                            its version is one the adapter implements: built against
                            that torch's headers and libraries, it makes Stowage
                            PyTorch's whole CUDA allocator (docs/torch.md). Without
                            it the wheel installs all the same, and
                            stowage.torch.enable() takes the pluggable route.

The wheel is tagged py3-none-<platform>: the package is ctypes over a C library,
so it fits every Python 3 of that platform. Only the standard library is used
(zipfile, hashlib, subprocess), so that a build needs nothing from an index.
There is no sdist: the package is built from a checkout (the C sources sit
beside python/, not under it).

config_settings (pip -C KEY=VALUE):
    build-dir   a CMake build folder to configure and build in, and keep
                (default: a temporary one, removed afterwards)
    cmake-args  extra arguments for the CMake configure step, space-separated
    torch-adapter  auto (default: build it when torch is importable), off, or
                require (a failure to build it fails the build)

Also a command, for tests and checkouts:
    python python/backend/stowage_backend.py torch-adapter OUT_DIR LIBSTOWAGE
builds OUT_DIR/libstowage_torch.so against the torch of the Python running it.
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


# ---- the C++ adapter (python/csrc/torch_allocator.cpp) ----

ADAPTER_SOURCE = os.path.join(PY_ROOT, "csrc", "torch_allocator.cpp")
ADAPTER_NAME = "libstowage_torch.so"
# The torch versions (major.minor) whose CUDAAllocator interface the adapter
# implements (the source's #if says the same), each with the C++ standard its
# headers need (torch.utils.cpp_extension's).
ADAPTER_TORCH = {"2.11": "c++17", "2.15": "c++20"}

_TORCH_PROBE = r"""
import json, os, torch
d = os.path.dirname(torch.__file__)
print(json.dumps({"version": torch.__version__, "dir": d, "cuda": torch.version.cuda,
                  "abi": int(torch._C._GLIBCXX_USE_CXX11_ABI)}))
"""


def _torch_info(python, log):
    """What the build needs of the torch `python` imports, or a reason why not."""
    r = subprocess.run([python, "-c", _TORCH_PROBE], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return None, "torch is not importable by %s (%s)" % (python, last)
    import json
    info = json.loads(r.stdout.strip().splitlines()[-1])
    mm = info["major_minor"] = ".".join(info["version"].split("+")[0].split(".")[:2])
    if mm not in ADAPTER_TORCH:
        return None, ("torch %s: the adapter implements the CUDAAllocator interface of torch %s"
                      % (info["version"], ", ".join(ADAPTER_TORCH)))
    if not info["cuda"]:
        return None, "torch %s is not a CUDA build" % info["version"]
    return info, None


def _cuda_paths(info):
    """(include dir, libcudart path) of the CUDA runtime this torch uses, or (None, why)."""
    major = info["cuda"].split(".")[0]
    site = os.path.dirname(info["dir"])
    roots = [os.path.join(site, "nvidia", "cu" + major),
             os.path.join(site, "nvidia", "cuda_runtime")]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            roots.append(os.environ[env])
    roots += ["/usr/local/cuda-%s" % info["cuda"], "/usr/local/cuda"]
    inc = lib = None
    for root in roots:
        if inc is None and os.path.isfile(os.path.join(root, "include", "cuda_runtime_api.h")):
            inc = os.path.join(root, "include")
        for sub in ("lib", "lib64", os.path.join("targets", "x86_64-linux", "lib")):
            cand = os.path.join(root, sub, "libcudart.so." + major)
            if lib is None and os.path.isfile(cand):
                lib = cand
    if inc is None or lib is None:
        return None, ("no CUDA %s runtime headers and libcudart.so.%s found (looked in %s)"
                      % (info["cuda"], major, ", ".join(roots)))
    return (inc, lib), None


def build_torch_adapter(out_dir, libstowage, log, python=None):
    """Builds out_dir/libstowage_torch.so against the torch that `python`
    (default: this one) imports, linked to libstowage (the path of the
    libstowage.so it goes beside). Returns (path, None), or (None, reason)
    when it is not built: no torch, a torch version the adapter does not
    implement, no CUDA runtime, or the compiler failed (its output in log)."""
    info, why = _torch_info(python or sys.executable, log)
    if info is None:
        return None, why
    cuda, why = _cuda_paths(info)
    if cuda is None:
        return None, why
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        return None, "no C++ compiler (c++ or g++; or set CXX)"
    tinc = os.path.join(info["dir"], "include")
    tlib = os.path.join(info["dir"], "lib")
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, ADAPTER_NAME)
    cmd = [cxx, "-std=" + ADAPTER_TORCH[info["major_minor"]], "-O2", "-fPIC", "-shared",
           "-fvisibility=hidden", "-Wall", "-Wextra", "-D_GLIBCXX_USE_CXX11_ABI=%d" % info["abi"],
           "-I", os.path.join(REPO, "include"),
           "-isystem", tinc, "-isystem", os.path.join(tinc, "torch", "csrc", "api", "include"),
           "-isystem", cuda[0], ADAPTER_SOURCE, "-o", out + ".tmp",
           os.path.realpath(libstowage), "-L", tlib, "-ltorch_cuda", "-lc10_cuda", "-lc10",
           cuda[1], "-Wl,-z,defs", "-Wl,-rpath-link," + tlib,
           "-Wl,-rpath,$ORIGIN:" + tlib + ":" + os.path.dirname(cuda[1])]
    log.write("stowage: building the torch adapter against torch %s (%s)\n"
              % (info["version"], info["dir"]))
    try:
        _run(cmd, log)
    except BuildError as exc:
        return None, "compiling %s failed: %s" % (ADAPTER_SOURCE, exc)
    os.replace(out + ".tmp", out)
    return out, None


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
    adapter_mode = settings.get("torch-adapter", "auto")
    if adapter_mode not in ("auto", "off", "require"):
        raise BuildError("torch-adapter=%s: auto, off or require" % adapter_mode)
    try:
        lib, cli = _cmake_build(build_dir, extra, sys.stderr)
        adapter = None
        if adapter_mode != "off":
            adapter, why = build_torch_adapter(build_dir, lib, sys.stderr)
            if adapter is None:
                if adapter_mode == "require":
                    raise BuildError("the torch adapter was not built: " + why)
                sys.stderr.write("stowage: the wheel has no torch adapter (%s); "
                                 "stowage.torch.enable() will take the pluggable route\n" % why)
        dist = "stowage-%s" % version
        name = "%s-%s.whl" % (dist, _tag())
        os.makedirs(wheel_directory, exist_ok=True)
        wheel = _Wheel(os.path.join(wheel_directory, name))
        for arcname, path in _package_files():
            wheel.add(arcname, _read(path))
        wheel.add("stowage/libstowage.so", _read(lib))
        if adapter:
            wheel.add("stowage/" + ADAPTER_NAME, _read(adapter))
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


if __name__ == "__main__":
    # python stowage_backend.py torch-adapter OUT_DIR LIBSTOWAGE
    if len(sys.argv) != 4 or sys.argv[1] != "torch-adapter":
        sys.exit("usage: %s torch-adapter OUT_DIR LIBSTOWAGE" % sys.argv[0])
    path, reason = build_torch_adapter(sys.argv[2], sys.argv[3], sys.stdout)
    if path is None:
        sys.exit("stowage: the torch adapter was not built: " + reason)
    print(path)
