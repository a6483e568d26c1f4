#!/usr/bin/env python3
"""tests/fuzz/planned_seeds.py: writes the seed inputs of fuzz_planned (tests/fuzz/corpus/planned/seed*).

Each seed is a program in fuzz_planned.c's encoding: setup and configuration
bytes, keys (slots and a step program each), a schedule of keys, a mutation
rate and its generator's seed, a fault to inject, the number of steps and the
weights. The programs are a forward/backward step (activations freed in
reverse, an input batch replaced each step), an inference call ended by
stow_pool_step(NULL), and two keys in turn on two streams; each on the classic
and the page-mapped pool, with and without mutations, with manual events or
not; and the training step without markers (planned_auto), with and without
mutations.

    python3 tests/fuzz/planned_seeds.py tests/fuzz/corpus/planned
"""
import os
import sys

MIB = 1 << 20


def slot(size_bytes, stream=0):
    """(mode, byte) of fuzz_planned.c's fz_slot_size at or above size_bytes,
    the stream coded in the mode's top bits (stream 0: any top bits but 3)."""
    if size_bytes <= 255 * 96 + 1:
        mode, b = 0, -(-(size_bytes - 1) // 96)
    elif size_bytes <= 256 * 64 * 1024:
        mode, b = 1, -(-size_bytes // (64 * 1024)) - 1
    else:
        mode, b = 2, min(255, -(-size_bytes // (MIB // 4)) - 1)
    if stream:
        mode |= 3 << 5 | stream << 2
    return mode, b


def key(slots, program):
    out = bytearray([len(slots) - 1])
    for size_bytes, stream in slots:
        out += bytes(slot(size_bytes, stream))
    out.append(len(program) - 1)
    out += bytes(program)
    return bytes(out)


def encode(setup, conf, keys, schedule, rate, seed, steps, weights=()):
    out = bytearray([setup, conf, len(keys) - 1])
    for k in keys:
        out += k
    out.append(len(schedule) - 1)
    out += bytes(schedule)
    out.append(rate)
    out += seed.to_bytes(8, "big")
    out += bytes([0x21, 0x40, 3, 0, 0, 0, 0, 0])  # a fault code for the injections
    out += (steps - 1).to_bytes(2, "big")
    out.append(len(weights))
    for w in weights:
        out += bytes(slot(w))
    return bytes(out)


# Forward: x (batch, replaced), a1..a4 allocated; backward: freed in reverse,
# with gradients-like small blocks in between.
TRAIN = key([(12 * MIB, 0), (40 * MIB, 0), (24 * MIB, 0), (3 * MIB, 0), (8 * MIB, 0),
             (4096, 0), (300, 0), (60 * MIB, 0)],
            [0xa0, 1, 2, 3, 4, 5, 6, 7, 7, 6, 4, 5, 3, 2, 1])
INFER = key([(10 * MIB, 0), (20 * MIB, 0), (20 * MIB, 0), (1 * MIB, 0)],
            [0, 1, 0, 2, 1, 3, 2, 3])
SIDE = key([(8 * MIB, 1), (8 * MIB, 2), (4 * MIB, 1), (512, 2)],
           [0, 1, 0, 2, 1, 3, 2, 3])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/planned"
    os.makedirs(out, exist_ok=True)
    seeds = []
    for policy in (0, 8):
        for events in (0, 4):  # setup bit 2: manual events
            setup = 2 | events   # capacity: unlimited
            seeds.append(encode(setup, policy | 0x80, [TRAIN], [0], 0, 7, 40, [200 * MIB]))
            seeds.append(encode(setup, policy, [TRAIN], [0], 24, 11, 300, [200 * MIB]))
            seeds.append(encode(setup, policy | 0x80, [INFER], [0x80], 0, 3, 30, [100 * MIB]))
            seeds.append(encode(setup, policy, [TRAIN, SIDE], [0, 1, 0, 1, 1], 12, 5, 200))
            seeds.append(encode(setup, policy | 0x10, [TRAIN, INFER, SIDE], [0, 0x81, 2],
                                40, 9, 400, [64 * MIB, 3 * MIB]))
            # Without markers (conf & 7 == 6: planned_auto), the steps found by the pool.
            seeds.append(encode(setup, policy | 6, [TRAIN], [0], 0, 13, 1500, [200 * MIB]))
            seeds.append(encode(setup, policy | 6, [TRAIN], [0], 1, 17, 1500, [200 * MIB]))
    for i, data in enumerate(seeds):
        with open(os.path.join(out, f"seed{i:02d}"), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} seeds in {out}")


if __name__ == "__main__":
    main()
