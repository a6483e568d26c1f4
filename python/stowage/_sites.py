"""The user's own line of each allocation, for recordings (stowage.record(lines=True)).

While on, the PyTorch entry point (python/csrc/torch_entry.c, stow_torch_set_site_hook) calls
hook() before each allocation of the global swap, on the allocating thread, through a ctypes
callback. It reads the allocating thread's Python frames (sys._getframe, at most
stack_tags.FRAME_LIMIT of them), picks the frame stack_tags' rule picks, and returns the id of
its text as a site (stowage/record.h), which the pool records with the allocation and
stow_trace_dump writes into TRACE.tags. Texts are interned once per (frame's code, line); the
cost of a call is the callback and the frame walk (docs/report.md, "The tags of a recording").

A thread with no Python frame (the autograd engine's threads, which run the backward pass)
gets '<backward> NODE' (the autograd node torch reports running there) or '<no Python frame>'.
"""

import ctypes
import sys

from . import _lib, stack_tags

NO_PYTHON_FRAME = "<no Python frame>"

_HOOK_T = ctypes.CFUNCTYPE(ctypes.c_uint32)
_ids = {}      # (code, line, via code, via line) or text -> site id; under the GIL
_hook = None   # the installed callback, kept alive while the library may call it


def _bind(lib):
    c = ctypes
    lib.stow_record_site_intern.restype = c.c_int
    lib.stow_record_site_intern.argtypes = [c.c_char_p, c.POINTER(c.c_uint32)]
    lib.stow_torch_set_site_hook.restype = None
    lib.stow_torch_set_site_hook.argtypes = [c.c_void_p]
    return lib


def _intern(text):
    """The site id of text (one line of at most 1023 bytes); 0 when the library refuses it."""
    raw = stack_tags.one_line(text).encode("utf-8", "replace")[:1023]
    out = ctypes.c_uint32(0)
    st = _bind(_lib.load()).stow_record_site_intern(raw, ctypes.byref(out))
    return out.value if st == 0 else 0


def _no_frame_site():
    torch = sys.modules.get("torch")
    node = None
    try:
        current = getattr(getattr(torch, "_C", None), "_current_autograd_node", None)
        node = current() if current is not None else None
    except Exception:
        node = None
    text = "<backward> %s" % node.name() if node is not None else NO_PYTHON_FRAME
    sid = _ids.get(text)
    if sid is None:
        sid = _ids[text] = _intern(text)
    return sid


def site_of(frame):
    """The site id of an allocation made under frame (the innermost Python frame of the
    allocating thread, or None)."""
    _, main, via = stack_tags.frame_tag_frames(frame)
    if main is None:
        return _no_frame_site()
    key = (main.f_code, main.f_lineno, None if via is None else via.f_code,
           0 if via is None else via.f_lineno)
    sid = _ids.get(key)
    if sid is None:
        text = stack_tags.live_frame_text(main)
        if via is not None:
            text += " via " + stack_tags.live_frame_text(via)
        sid = _ids[key] = _intern(text)
    return sid


def hook():
    """The site of the allocation being made; 0 on any error (a callback must not raise)."""
    try:
        try:
            frame = sys._getframe(1)  # the frame that called into the library
        except ValueError:
            frame = None              # a thread that runs no Python code
        return site_of(frame)
    except BaseException:
        return 0


def install(on):
    """Sets (on) or removes the hook in the library."""
    global _hook
    lib = _bind(_lib.load())
    if on:
        if _hook is None:
            _hook = _HOOK_T(hook)
        lib.stow_torch_set_site_hook(ctypes.cast(_hook, ctypes.c_void_p))
    else:
        lib.stow_torch_set_site_hook(None)
