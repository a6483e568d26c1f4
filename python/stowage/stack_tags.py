"""The one rule that turns a recorded stack into an allocation's tag.

A stack is a list of frames, innermost first, each a dict with 'filename', 'line' and 'name':
what torch.cuda.memory._dump_snapshot() writes for every trace entry. Python frames have a
'.py' file or a '<...>' pseudo-file; the others are C and C++ frames, whose file is often '??'
or empty. The tag is '<filename>:<line> <name>' of one frame, taken in this order
(docs/report.md, "Tags from stacks"):

  user      the innermost Python frame of the user's own code: outside torch, the standard
            library and installed packages. When frames of installed packages lie between it
            and the allocation, the innermost of them follows after ' via ' (a library line
            that many of the user's lines call, such as einops' einsum, then splits by caller).
  package   the innermost Python frame of an installed package (site-packages, dist-packages).
  python    the innermost Python frame (torch's or the standard library's).
  backward  the autograd node that ran the allocation ('torch::autograd::...::XBackward0::apply'):
            the autograd engine's threads have no Python frames.
  native    the innermost C++ frame outside torch, c10, pybind11, CUDA's libraries and the C++
            standard library. Frames without a signature ('cfunction_call', '_PyEval_...',
            'clone') are C functions of the interpreter, the C library or CUDA's driver.
  unknown   the fixed text '<unknown>'.

A stack that is absent or empty gives no tag. The text is one line: line breaks and NUL bytes
become spaces, leading blanks go (the '<id> <tag>' files that `stowage report` and `diff` read
hold one tag a line; stow_tag_set refuses such names for the same reason).

Only the standard library is used. Everything Stowage turns from a recorded stack into a tag
goes through stack_tag(); the snapshot importer is its caller, bench/snapshot_tags.py checks it
on the public snapshots. A live stack (a running program's frames, as stowage.record reads them
at each allocation) goes through frame_tag_frames(), the same rule on Python frames alone.
"""

import re

UNKNOWN = "<unknown>"
TIERS = ("user", "package", "python", "backward", "native", "unknown")

# C++ namespaces of the libraries under the user's code: a frame in one of them is never the
# 'native' tag. The anonymous namespace is there because its owner cannot be told from a name.
SKIPPED_NAMESPACES = frozenset((
    "torch", "at", "c10", "caffe2", "pytorch_flash", "fbgemm", "pybind11",
    "std", "__gnu_cxx", "__cxxabiv1",
    "cuda", "cub", "thrust", "cutlass", "cute", "cudnn", "cudnn_frontend", "cublas", "cublasLt",
    "nccl", "(anonymous namespace)",
))
# lib/python3.12/ (lib64 on some distributions) and, on Windows, Lib/ under a drive, or
# Python310/lib/ and cpython-3.10.19-windows-x86_64-none/lib/: the standard library, unless
# installed packages follow. A project's own lib/ directory is the user's.
_STDLIB = re.compile(r"((^|/)(lib(64)?/python\d[^/]*|(?i:python\d*|cpython-[^/]+)/lib)"
                     r"|^[A-Za-z]:/(.*/)?Lib)/(?!(site|dist)-packages/)")
_BACKWARD = re.compile(r"^torch::autograd::(?:[\w]+::)*(\w+)::apply$")


def one_line(text):
    """text as one line of a tags file holds it: line breaks and NUL bytes become spaces, and
    leading blanks, which the reader drops after the id, go."""
    return text.replace("\r", " ").replace("\n", " ").replace("\0", " ").lstrip(" \t\v\f")


def _filename(frame):
    return str(frame.get("filename", "")).replace("\\", "/")


def _is_python(fn):
    return fn.endswith(".py") or fn.startswith("<")


def python_kind(fn):
    """'torch', 'stdlib', 'package' or 'user' for a Python frame's file (slashes forward)."""
    parts = fn.split("/")
    # inductor's generated kernels live in /tmp/torchinductor_<user>/, fx's code in
    # '<eval_with_key>.N': torch's, not the user's.
    if ("torch" in parts or any(p.startswith("torchinductor_") for p in parts)
            or fn.startswith("<eval_with_key>")):
        return "torch"
    if fn.startswith("<frozen ") or _STDLIB.search(fn):
        return "stdlib"
    if "site-packages" in parts or "dist-packages" in parts:
        return "package"
    return "user"


def _qualified_name(name):
    """'ns::cls::fn' of a demangled C++ frame name, or None for a C name (no signature)."""
    depth, cut = 0, None
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif c == "(" and depth == 0 and not name.startswith("(anonymous namespace)", i):
            cut = i
            break
    if cut is None:
        return None
    head = name[:cut]
    if head.endswith("::operator"):  # 'X::operator()(...)': the first '(' was the operator's
        head = head[:-len("::operator")]
    # The last blank outside template arguments ends a return type ('void', 'at::Tensor').
    depth, start = 0, 0
    for i, c in enumerate(head):
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif c == " " and depth == 0 and not head.endswith("(anonymous", 0, i):
            start = i + 1
    return head[start:]


def _namespace(qualified):
    first = qualified.split("::", 1)[0] if "::" in qualified else ""
    return first.split("<", 1)[0]


def _native_ok(name):
    q = _qualified_name(name)
    if not q:
        return False
    return _namespace(q) not in SKIPPED_NAMESPACES and not q.startswith("THP")


def _backward(name):
    q = _qualified_name(name)
    return bool(q) and bool(_BACKWARD.match(q)) and q != "torch::autograd::Node::apply"


def format_frame(frame):
    """'<filename>:<line> <name>' of one frame, as recorded."""
    return "%s:%s %s" % (frame.get("filename", ""), frame.get("line", "?"),
                         frame.get("name", "?"))


def stack_tag(frames):
    """(tag, tier) for a recorded stack (innermost frame first); (None, None) without frames.

    tier is one of TIERS; the tag is one line. Frames that are not dicts are ignored."""
    if not isinstance(frames, (list, tuple)) or not frames:
        return None, None
    frames = [f for f in frames if isinstance(f, dict)]
    first = {}  # tier -> the innermost frame of it
    for f in frames:
        fn = _filename(f)
        if _is_python(fn):
            kind = python_kind(fn)
            if kind == "user":
                first.setdefault("user", f)
                break  # nothing further out can win
            if kind == "package":
                first.setdefault("package", f)
            else:
                first.setdefault("python", f)
        else:
            name = str(f.get("name", ""))
            if "backward" not in first and _backward(name):
                first["backward"] = f
            elif "native" not in first and _native_ok(name):
                first["native"] = f
    for tier in TIERS[:-1]:
        if tier in first:
            tag = format_frame(first[tier])
            if tier == "user" and "package" in first:  # a package frame inside the user's
                tag += " via " + format_frame(first["package"])
            return one_line(tag), tier
    return UNKNOWN, "unknown"


# ---- live stacks: the frames of a running program ----

FRAME_LIMIT = 64  # frames read at most, innermost first: the user's line is rarely deeper
_kinds = {}       # co_filename -> python_kind, read once per file


def _live_kind(filename):
    kind = _kinds.get(filename)
    if kind is None:
        kind = _kinds[filename] = python_kind(filename.replace("\\", "/"))
    return kind


def frame_tag_frames(frame, limit=FRAME_LIMIT):
    """(tier, frame, via) for a live stack, frame being its innermost Python frame (f_back leads
    outwards): stack_tag's rule on Python frames, every one of which is a Python frame here.
    tier is 'user' (via: the innermost package frame inside it, or None), 'package' or
    'python' (via None); (None, None, None) when frame is None or no frame is read. At most
    `limit` frames are read, so the cost stays bounded on deep stacks."""
    package = python = None
    while frame is not None and limit > 0:
        kind = _live_kind(frame.f_code.co_filename)
        if kind == "user":
            return "user", frame, package
        if kind == "package":
            if package is None:
                package = frame
        elif python is None:
            python = frame
        frame = frame.f_back
        limit -= 1
    if package is not None:
        return "package", package, None
    if python is not None:
        return "python", python, None
    return None, None, None


def live_frame_text(frame):
    """'<filename>:<line> <name>' of a live frame, as format_frame writes a recorded one."""
    return "%s:%s %s" % (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def frame_tag(frame, limit=FRAME_LIMIT):
    """(tag, tier) for a live stack (innermost Python frame first), as stack_tag gives for the
    same frames recorded; (None, None) without a frame."""
    tier, main, via = frame_tag_frames(frame, limit)
    if main is None:
        return None, None
    tag = live_frame_text(main)
    if via is not None:
        tag += " via " + live_frame_text(via)
    return one_line(tag), tier
