#!/usr/bin/env python3
"""tests/check/layers.py: the layering of allocator/ (docs/design.md, the request path).

Each file of allocator/ may include only the allocator headers its row of INCLUDES names:
the table is the include graph the layers allow, and a new file needs a row. Each layer's
private state (STATES) is read only by its own files: elsewhere the pool's field
(pool->FIELD) may appear only as the argument of one of the layer's functions
(`stow__vmm_step_active(&pool->step)`), and the state's type name only in its own header,
its own files and pool.h (which embeds it).
Prints each violation with its file and line, and exits 1 when there is one.
Usage: python3 tests/check/layers.py [REPO_ROOT]      (default: this script's repository)
"""
import os
import re
import sys

# file -> the allocator headers it may include (allocator/ left out).
INCLUDES = {
    # the mechanisms every layer may use
    "assert.h": "",
    "types.h": "",
    "lock.h": "",
    "period.h": "",
    "options.h": "",
    "ptr_map.h": "assert.h",
    "block_store.h": "assert.h types.h",
    "check.h": "assert.h",
    # the layers' states and entry points (no pool)
    "free_index.h": "types.h",
    "quick.h": "types.h",
    "stream.h": "types.h",
    "segment.h": "types.h",
    "vmm_allowance.h": "",
    "vmm_epochs.h": "types.h",
    "vmm_step.h": "types.h",
    # the pool, which embeds the states, and the headers inline over it
    "pool.h": "assert.h block_store.h lock.h ptr_map.h segment.h types.h vmm_allowance.h "
              "vmm_epochs.h vmm_step.h",
    "recorder.h": "assert.h pool.h",
    "vmm.h": "assert.h pool.h types.h",
    "vmm_granules.h": "pool.h types.h vmm.h",
    "planned_serve.h": "pool.h types.h",
    "planned.h": "ptr_map.h types.h",
    # the files
    "arena.c": "",
    "status.c": "",
    "lock.c": "lock.h",
    "period.c": "period.h",
    "options.c": "options.h types.h",
    "ptr_map.c": "assert.h ptr_map.h",
    "block_store.c": "assert.h block_store.h types.h",
    "size_class.c": "free_index.h types.h",
    "free_index.c": "assert.h free_index.h types.h",
    "quick.c": "pool.h ptr_map.h quick.h types.h vmm.h",
    "stream.c": "assert.h free_index.h pool.h ptr_map.h stream.h types.h",
    "segment.c": "block_store.h planned_serve.h pool.h quick.h recorder.h segment.h stream.h "
                 "types.h vmm.h",
    "vmm.c": "assert.h block_store.h pool.h recorder.h segment.h types.h vmm.h vmm_allowance.h "
             "vmm_epochs.h vmm_granules.h",
    "vmm_allowance.c": "pool.h types.h vmm_allowance.h vmm_granules.h vmm_step.h",
    "vmm_epochs.c": "assert.h pool.h types.h vmm_epochs.h",
    "vmm_place.c": "free_index.h pool.h types.h vmm.h vmm_granules.h",
    "vmm_check.c": "pool.h types.h vmm.h vmm_epochs.h vmm_granules.h",
    # the learner reads the allowance, and tells the unmap epochs when its layout holds
    "vmm_step.c": "block_store.h free_index.h period.h pool.h ptr_map.h types.h vmm_allowance.h "
                  "vmm_epochs.h vmm_granules.h vmm_step.h",
    "planned_serve.c": "assert.h planned.h planned_serve.h pool.h ptr_map.h recorder.h types.h "
                       "vmm.h",
    "planned_record.c": "planned.h ptr_map.h types.h",
    "planned_plan.c": "planned.h types.h",
    "planned_auto.c": "period.h planned.h pool.h ptr_map.h types.h",
    "planned_check.c": "check.h planned.h planned_serve.h pool.h ptr_map.h types.h",
    "record.c": "lock.h pool.h ptr_map.h recorder.h",
    "snapshot.c": "lock.h pool.h recorder.h types.h",
    "step.c": "check.h lock.h planned_serve.h pool.h recorder.h",
    "check.c": "check.h planned_serve.h pool.h ptr_map.h types.h vmm.h",
    "pool.c": "assert.h block_store.h check.h free_index.h lock.h options.h planned_serve.h "
              "pool.h ptr_map.h quick.h recorder.h segment.h stream.h types.h vmm.h "
              "vmm_allowance.h vmm_epochs.h vmm_step.h",
    "backend/cuda.c": "",
    "backend/sim.c": "ptr_map.h types.h",
}

# A layer's private state: the pool's field, its types, and the files that may read it.
STATES = [
    ("step", ["stow_vmm_step_t"], ["vmm_step.h", "vmm_step.c"]),
    ("adapt", ["stow_vmm_adapt_t"], ["vmm_allowance.h", "vmm_allowance.c"]),
    ("epochs", ["stow_vmm_epochs_t", "stow_vmm_closure_t"], ["vmm_epochs.h", "vmm_epochs.c"]),
    ("idle_keep", ["stow_idle_keep_t"], ["segment.h", "segment.c"]),
]

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"allocator/([^"]+)"')


def strip_comments(text):
    """Comments blanked, line breaks kept (line numbers stay right)."""
    return re.sub(r"/\*.*?\*/|//[^\n]*",
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    alloc = os.path.join(root, "allocator")
    files = []
    for dirpath, _, names in os.walk(alloc):
        for name in names:
            if name.endswith((".c", ".h")):
                files.append(os.path.relpath(os.path.join(dirpath, name), alloc))
    if not files:
        print(f"layers: no allocator/ under {root}", file=sys.stderr)
        return 2
    errors = []
    for rel in sorted(files):
        with open(os.path.join(alloc, rel), encoding="utf-8") as f:
            text = f.read()
        code = strip_comments(text)
        allowed = INCLUDES.get(rel)
        if allowed is None:
            errors.append(f"allocator/{rel}: not in the include table of tests/check/layers.py")
            allowed = ""
        allowed = set(allowed.split())
        for no, line in enumerate(code.split("\n"), 1):
            m = INCLUDE_RE.match(line)
            if m and m.group(1) not in allowed:
                errors.append(f"allocator/{rel}:{no}: includes allocator/{m.group(1)}, "
                              f"which its layer may not (allowed: {' '.join(sorted(allowed)) or 'none'})")
        for field, types, owners in STATES:
            if rel in owners:
                continue
            for no, line in enumerate(code.split("\n"), 1):
                for m in re.finditer(r"\bpool\s*->\s*" + field + r"\b", line):
                    # The one use allowed: &pool->field handed to a function (an accessor).
                    before = line[:m.start()]
                    if not re.search(r"\bstow__\w+\(\s*&\s*$", before) or \
                            not re.match(r"\s*[,)]", line[m.end():]):
                        errors.append(f"allocator/{rel}:{no}: reads the {field} state "
                                      f"({', '.join(owners)} own it): {line.strip()}")
                if rel == "pool.h":
                    continue
                for t in types:
                    if re.search(r"\b" + t + r"\b", line):
                        errors.append(f"allocator/{rel}:{no}: names {t} "
                                      f"({', '.join(owners)} own it): {line.strip()}")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"layers: {len(errors)} violation(s); the table is tests/check/layers.py",
              file=sys.stderr)
        return 1
    print(f"layers: {len(files)} files of allocator/ keep to their layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
