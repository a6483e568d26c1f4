#!/usr/bin/env python3
"""tests/fuzz/step_seeds.py: writes the seed inputs of fuzz_step (tests/fuzz/corpus/step/seed*).

Each seed is a loop in fuzz_step.c's encoding: setup and configuration bytes,
weights, slots, a step program, the number of steps and the deviations. The
loops are bench/random_loops.py's seeds 0, 4 and 33 (tests/support/test_support.c),
with sizes rounded to what the encoding can say, and a forward/backward step
whose activations are freed in reverse (with an input batch replaced each step, too),
each with and without deviations.

    python3 tests/fuzz/step_seeds.py tests/fuzz/corpus/step
"""
import os
import sys

MIB = 1 << 20


def size_code(size_bytes):
    """(mode, byte) of fuzz_step.c's fz_slot_size nearest above size_bytes."""
    if size_bytes <= 256 * 4096:
        return 0, max(0, -(-size_bytes // 4096) - 1)
    if size_bytes <= 256 * 256 * 1024:
        return 1, -(-size_bytes // (256 * 1024)) - 1
    return 2, min(255, -(-size_bytes // MIB) - 1)


def encode(setup, conf, weights, slots, program, steps, deviations=(), inject=b""):
    out = bytearray([setup, conf])
    out.append(len(weights))
    for w in weights:
        out += bytes(size_code(w))
    out.append(len(slots) - 1)  # fuzz_step reads 1 + byte % 16
    for size_bytes, stream in slots:
        mode, b = size_code(size_bytes)
        out += bytes([mode | stream << 2, b])
    out.append(len(program) - 1)  # 1 + byte % 96
    out += bytes(program)
    out += (steps - 1).to_bytes(2, "big")  # 1 + value % (16384 / program)
    out.append(len(deviations))
    for step, entry, action, arg in deviations:
        out += step.to_bytes(2, "big") + bytes([entry, action, arg]) + inject.ljust(8, b"\0")
    return bytes(out)


LOOP4 = (
    [24, 64, 24, 24, 40, 24, 64, 64, 40, 40, 24, 40, 40, 64, 64],
    [16384, 98816, 3072, 2048, 99840, 16384, 7680],
    [2, 2, 6, 1, 6, 0, 2, 1, 0, 6, 5, 6, 2, 6, 2, 1, 1, 2, 2, 5, 6, 5, 6, 6, 2,
     0, 6, 4, 2, 5, 3, 4, 1, 1, 1, 3, 2, 0, 6, 6, 4, 6, 2, 0, 2, 4, 5, 2, 6, 6,
     4, 1, 3, 3, 4, 2, 3, 3, 1, 1, 2, 2, 6, 6, 0, 0, 0, 3, 5, 2, 4, 4, 5, 3])
LOOP0 = (
    [24, 40, 64, 40, 64, 24, 64, 40, 64, 24, 64, 64, 64, 40, 40, 24, 64, 40, 40, 64],
    [98816, 1536, 205312, 98816, 133632, 262144, 204800, 16384, 3584, 17920, 262144, 16384],
    [10, 5, 7, 8, 1, 5, 6, 5, 9, 10, 3, 8, 7, 7, 8, 4, 0, 8, 0, 1, 11, 6, 11, 10, 10, 0, 9, 7,
     5, 3, 11, 5, 11, 1, 3, 9, 3, 3, 2, 8, 7, 1, 1, 5])
LOOP33 = (
    [40, 40, 40, 24, 24, 64],
    [4608, 6656, 134656, 206336, 4608, 263680, 42496, 205312, 133632, 308736],
    [4, 6, 4, 8, 7, 0, 9, 6, 4, 5, 8, 3, 1, 0, 5, 4, 3, 1, 5, 1, 5, 3,
     8, 4, 5, 0, 5, 8, 4, 8, 6, 6, 2, 1, 0, 5, 8, 1, 1, 2, 1, 1, 5, 0])


def random_loop(loop, scale=1.0):
    weights_mib, slot_kib, program = loop
    return ([int(w * MIB * scale) for w in weights_mib],
            [(int(k * 1024 * scale), 0) for k in slot_kib], program)


def forward_backward():
    """Activations 0..5 made in order, freed in reverse; gradients 6..8 in between."""
    sizes = [48 * MIB, 40 * MIB, 33 * MIB, 40 * MIB, 9 * MIB, 21 * MIB, 12 * MIB, 30 * MIB, 7 * MIB]
    program = [0, 1, 2, 3, 4, 5, 6, 5, 4, 7, 3, 6, 2, 8, 1, 7, 0, 8]
    return [100 * MIB, 60 * MIB, 3 * MIB], [(s, 0) for s in sizes], program


def seeds():
    w4, s4, p4 = random_loop(LOOP4)
    w33, s33, p33 = random_loop(LOOP33, 0.5)
    wf, sf, pf = forward_backward()
    capacity_1g, capacity_512m = 2, 1
    yield "seed-loop4", encode(capacity_1g, 0, w4, s4, p4, 200)
    yield "seed-loop33-half", encode(capacity_1g, 0, w33, s33, p33, 300)
    # The plan met: an entry skipped after it is taken, empty_cache, a fault on
    # the next map (action 4: fz_inject reads 10: fail_nth with EBACKEND, 9: STOW_SIM_MAP, 1: nth).
    yield "seed-loop33-half-deviations", encode(capacity_1g, 0, w33, s33, p33, 300,
                                                [(150, 7, 0, 0), (200, 12, 3, 0), (250, 20, 4, 0)],
                                                inject=bytes([10, 9, 1]))
    yield "seed-forward-backward", encode(capacity_512m, 0, wf, sf, pf, 800)
    # Blocks that outlive their step (conf bit 2: what a step leaves is carried).
    yield "seed-loop4-carry", encode(capacity_1g, 4, w4, s4, p4, 200)
    # Deviations late in the loop: an entry skipped, empty_cache, a request never made.
    yield "seed-loop4-deviations", encode(capacity_1g, 0, w4, s4, p4, 200,
                                          [(150, 10, 0, 0), (170, 3, 3, 0), (185, 40, 2, 0x82)])
    # Long loops (conf bit 128: up to 131,072 operations), where the adaptive allowance
    # may raise a pool that keeps remapping, before or after a plan.
    w0, s0, p0 = random_loop(LOOP0, 0.45)
    yield "seed-loop0-long", encode(capacity_1g, 128, w0, s0, p0, 2500)
    yield "seed-loop4-long", encode(capacity_1g, 128, w4, s4, p4, 1700)
    # Manual events, four streams' completions in the program, the key off (conf 3).
    pm = pf + [0x81, 0x80]  # stream 1's work completes, then stream 0's
    yield "seed-forward-backward-events", encode(capacity_512m | 4, 0, wf,
                                                 [(s, i % 2) for i, (s, _) in enumerate(sf)], pm, 600)
    yield "seed-forward-backward-nokey", encode(capacity_512m, 3, wf, sf, pf, 600)
    # An input batch replaced at each step's start (entry 0xA0 | slot: the new one made,
    # then the old one freed; not a leftover of its step): it lives a little over a step,
    # so the planned cycle is two steps long. Loop 4 (74 entries) at 0.6 x on 512 MiB;
    # loop 0's program twice a step (a step of at least 50 operations, as the pool's
    # search needs) at 0.45 x on 1 GiB.
    w4s, s4s, _ = random_loop(LOOP4, 0.6)
    yield "seed-loop4-batch", encode(capacity_512m, 0, w4s, s4s + [(8 * MIB, 0)],
                                     [0xA0 | len(s4s)] + p4, 180)
    w0s, s0s, _ = random_loop(LOOP0, 0.45)
    yield "seed-loop0-batch", encode(capacity_1g, 0, w0s, s0s + [(8 * MIB, 0)],
                                     [0xA0 | len(s0s)] + p0 + p0, 180)

def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/step"
    os.makedirs(out_dir, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
