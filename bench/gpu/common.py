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
