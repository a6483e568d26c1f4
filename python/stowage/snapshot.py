"""Stowage pools in the structure torch.cuda.memory._snapshot() returns.

    snap = stowage.snapshot.memory_snapshot()        # every device's pool (global swap)
    stowage.snapshot.dump_snapshot("stowage.pickle")  # what pytorch.org/memory_viz opens

Pure Python over ctypes (stow_pool_snapshot and stow_record_read,
include/stowage/snapshot.h); it never imports torch. stowage.torch exposes the
same two functions, and for a MemPool served by Stowage (stowage.torch.mem_pool).

The dict holds what PyTorch's holds (its keys and types were checked against
public snapshots, tests/python/test_torch_snapshot.py):
- 'segments': one dict per segment with 'device', 'address', 'total_size',
  'allocated_size', 'active_size', 'requested_size', 'stream', 'segment_type'
  ('small' or 'large'), 'segment_pool_id', 'is_expandable', 'frames' and
  'blocks' (each with 'address', 'size', 'requested_size', 'state' and
  'frames'), by address; the blocks tile their segment. A page-mapped pool's
  segments are its runs of mapped granules (is_expandable True), as PyTorch
  shows expandable segments.
- 'device_traces': per device, the pool's recorded events when recording is on
  (stowage.record, or record_events:N in STOWAGE_CONF), else []: 'alloc',
  'free_requested' and 'free_completed' (both at the free: Stowage records the
  free, not when a record_stream use let it complete), 'segment_alloc' and
  'segment_free' (classic), 'segment_map' and 'segment_unmap' (policy vmm, one
  granule each), 'oom' ('device_free' is not recorded: 0), each with 'addr',
  'size', 'stream', 'time_us' and 'frames'.
- 'allocator_settings' (the STOWAGE_CONF in force, Stowage's version) and
  'external_annotations' ([]).
Frames: Stowage records no stacks. A block or event of a tagged allocation
(stowage.set_tag) gets one frame naming its tag, {'filename': '<stowage tag>',
'line': 0, 'name': TAG}, which the viewers show as its stack.
"""

import ctypes
import os
import pickle

from . import _lib

TAG_FILENAME = "<stowage tag>"
_STATES = {0: "active_allocated", 1: "active_pending_free", 2: "inactive"}
_KINDS = {1: "small", 2: "large"}
_ALLOC, _FREE, _SEG_RESERVE, _SEG_RELEASE, _MAP, _UNMAP, _OOM = range(7)


class _Segment(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint64), ("size_bytes", ctypes.c_uint64),
                ("first_block", ctypes.c_uint64), ("block_count", ctypes.c_uint64),
                ("pool_kind", ctypes.c_uint32), ("mapped_run", ctypes.c_uint32)]


class _Block(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint64), ("size_bytes", ctypes.c_uint64),
                ("requested_bytes", ctypes.c_uint64), ("stream", ctypes.c_uint64),
                ("state", ctypes.c_uint32), ("tag", ctypes.c_uint32)]


class _Totals(ctypes.Structure):
    _fields_ = [("segment_count", ctypes.c_size_t), ("block_count", ctypes.c_size_t),
                ("unmapped_bytes", ctypes.c_uint64), ("page_mapped", ctypes.c_uint32),
                ("reserved_", ctypes.c_uint32)]


class _Event(ctypes.Structure):
    _fields_ = [("time_ns", ctypes.c_uint64), ("addr", ctypes.c_uint64),
                ("size_bytes", ctypes.c_uint64), ("stream", ctypes.c_uint64),
                ("kind", ctypes.c_uint32), ("tag", ctypes.c_uint32)]


def _bind(lib):
    if getattr(lib, "_stowage_snapshot_bound", False):
        return lib
    c = ctypes
    lib.stow_pool_snapshot.restype = c.c_int
    lib.stow_pool_snapshot.argtypes = [c.c_void_p, c.POINTER(_Segment), c.c_size_t,
                                       c.POINTER(_Block), c.c_size_t, c.POINTER(_Totals)]
    lib.stow_record_read.restype = c.c_int
    lib.stow_record_read.argtypes = [c.c_void_p, c.POINTER(_Event), c.c_size_t,
                                     c.POINTER(c.c_size_t), c.POINTER(c.c_uint64)]
    lib.stow_tag_name.restype = c.c_char_p
    lib.stow_tag_name.argtypes = [c.c_uint]
    lib._stowage_snapshot_bound = True
    return lib


def pool_state(pool):
    """(segments, blocks, totals) of a stow_pool_t* (an int): ctypes arrays."""
    lib = _bind(_lib.load())
    seg_cap, blk_cap = 64, 1024
    while True:
        segs, blks, totals = (_Segment * seg_cap)(), (_Block * blk_cap)(), _Totals()
        st = lib.stow_pool_snapshot(pool, segs, seg_cap, blks, blk_cap, ctypes.byref(totals))
        if st != 0:
            raise OSError("stow_pool_snapshot: %s" % _lib.strerror(st))
        if totals.segment_count <= seg_cap and totals.block_count <= blk_cap:
            return segs[:totals.segment_count], blks[:totals.block_count], totals
        seg_cap = max(seg_cap, 2 * totals.segment_count)
        blk_cap = max(blk_cap, 2 * totals.block_count)


def pool_events(pool):
    """(events, start_unix_ns) of a recording pool, oldest first; None when it
    does not record."""
    lib = _bind(_lib.load())
    count, start = ctypes.c_size_t(0), ctypes.c_uint64(0)
    if lib.stow_record_read(pool, None, 0, ctypes.byref(count), None) != 0:
        return None
    cap = count.value + 1024
    while True:
        events = (_Event * cap)()
        st = lib.stow_record_read(pool, events, cap, ctypes.byref(count), ctypes.byref(start))
        if st != 0:
            raise OSError("stow_record_read: %s" % _lib.strerror(st))
        if count.value <= cap:
            return events[:count.value], start.value
        cap = 2 * count.value


def _frames(tag):
    if not tag:
        return []
    name = _bind(_lib.load()).stow_tag_name(tag).decode("utf-8", "replace")
    return [{"filename": TAG_FILENAME, "line": 0, "name": name}] if name else []


def _segments(device, pool, pool_id):
    segs, blks, totals = pool_state(pool)
    out = []
    for s in segs:
        blocks, allocated, active, requested, stream = [], 0, 0, 0, None
        for b in blks[s.first_block:s.first_block + s.block_count]:
            state = _STATES[b.state]
            if state != "inactive":
                active += b.size_bytes
                if stream is None:
                    stream = b.stream
            if state == "active_allocated":
                allocated += b.size_bytes
                requested += b.requested_bytes
            blocks.append({"address": b.addr, "size": b.size_bytes,
                           "requested_size": b.requested_bytes, "state": state,
                           "frames": _frames(b.tag)})
        out.append({"device": device, "address": s.addr, "total_size": s.size_bytes,
                    "allocated_size": allocated, "active_size": active,
                    "requested_size": requested,
                    # Mapped runs and their map events share stream 0, so that a
                    # viewer merging runs it rebuilds sees the same segments.
                    "stream": 0 if s.mapped_run or stream is None else stream,
                    "segment_type": _KINDS.get(s.pool_kind, "large"),
                    "segment_pool_id": tuple(pool_id), "is_expandable": bool(s.mapped_run),
                    "frames": [], "blocks": blocks})
    return out, totals


def _trace(pool, page_mapped):
    got = pool_events(pool)
    if got is None:
        return []
    events, start_ns = got
    out, alloc_size = [], {}
    for e in events:
        time_us = (start_ns + e.time_ns) // 1000
        base = {"addr": e.addr, "stream": e.stream, "time_us": time_us, "frames": _frames(e.tag)}
        if e.kind == _ALLOC:
            alloc_size[e.addr] = e.size_bytes
            out.append(dict(base, action="alloc", size=e.size_bytes))
        elif e.kind == _FREE:
            # PyTorch's free entries carry the allocation's size.
            size = alloc_size.pop(e.addr, e.size_bytes)
            out.append(dict(base, action="free_requested", size=size))
            out.append(dict(base, action="free_completed", size=size, frames=list(base["frames"])))
        elif e.kind in (_SEG_RESERVE, _SEG_RELEASE):
            if page_mapped:
                continue  # an address range, not memory: the map events are the segments
            action = "segment_alloc" if e.kind == _SEG_RESERVE else "segment_free"
            out.append(dict(base, action=action, size=e.size_bytes))
        elif e.kind in (_MAP, _UNMAP):
            action = "segment_map" if e.kind == _MAP else "segment_unmap"
            out.append(dict(base, action=action, size=e.size_bytes, stream=0))
        elif e.kind == _OOM:
            out.append(dict(base, action="oom", addr=0, size=e.size_bytes, device_free=0))
    return out


def pools_snapshot(pools, pool_id=(0, 0)):
    """The snapshot dict of {device: stow_pool_t* (int)}; see the module's doc."""
    segments, traces = [], []
    n_devices = max(pools) + 1 if pools else 0
    for device in range(n_devices):
        pool = pools.get(device)
        if not pool:
            traces.append([])
            continue
        segs, totals = _segments(device, pool, pool_id)
        segments.extend(segs)
        traces.append(_trace(pool, bool(totals.page_mapped)))
    from . import version
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"allocator": "stowage",
                                   "stowage_version": "%d.%d.%d" % version(),
                                   "STOWAGE_CONF": os.environ.get("STOWAGE_CONF", "")},
            "external_annotations": []}


def global_pools():
    """{device: pool} of the global swap's pools (stowage.torch.enable)."""
    lib = _lib.load()
    pools = {}
    for d in range(64):  # STOW_TORCH_MAX_DEVICES
        p = lib.stow_torch_pool(d)
        if p:
            pools[d] = p
    return pools


def memory_snapshot(device=None):
    """The global swap's pools (one device, or all) as torch.cuda.memory._snapshot()."""
    pools = global_pools()
    if device is not None:
        pools = {device: pools[device]} if device in pools else {}
    return pools_snapshot(pools)


def dump_snapshot(path, snapshot=None):
    """Pickles a snapshot (default: memory_snapshot()) to path, as
    torch.cuda.memory._dump_snapshot does."""
    snap = memory_snapshot() if snapshot is None else snapshot
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    return path
