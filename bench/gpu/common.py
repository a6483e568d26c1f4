"""Helpers shared by the bench/gpu Python scripts."""

import json
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))


def write_json(path, obj):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
    print(json.dumps(obj, sort_keys=True))


def load_rep(path):
    """A .rep trace as a list of (kind, id, size, stream) and the id count."""
    with open(path) as f:
        lines = [l.split() for l in f if l.strip() and not l.startswith("#")]
    nids = int(lines[0][0])
    events = []
    for p in lines[1:]:
        if p[0] == "a":
            events.append((0, int(p[1]), int(p[2]), int(p[3])))
        else:
            events.append((1, int(p[1]), 0, 0))
    return nids, events


def peaks_and_reset(torch, stowage):
    """Both allocators' peak reserved bytes since the last call; then both caches
    emptied and both peaks reset, for the next trace."""
    torch.cuda.synchronize()
    peaks = {"torch_peak_reserved": torch.cuda.max_memory_reserved(),
             "stowage_peak_reserved": stowage.max_memory_reserved()}
    torch.cuda.empty_cache()
    stowage.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    stowage.reset_peak_memory_stats()
    return peaks
