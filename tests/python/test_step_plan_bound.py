"""Tests of bench/step_plan_bound.py (the layout a loop's own step allows) on loops built here,
whose figures are worked out by hand."""

import os
import random
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")
SCRIPT = os.path.join(BENCH, "step_plan_bound.py")
sys.path.insert(0, HERE)
sys.path.insert(0, BENCH)

import step_plan_bound  # noqa: E402
from script_runner import run_on_file, stowage_cli  # noqa: E402

MIB = 1 << 20
PADDING = 25  # alloc-free pairs of 512 bytes per step: a step of at least MIN_PERIOD events


def loop(steps, step_body):
    """A .rep text: 10 MiB of weights (never freed), then `steps` steps. step_body(k, alloc,
    free) writes step k's events (alloc(size) returns the id); each step ends with PADDING
    allocations of 512 bytes freed at once."""
    lines, next_id = [], 0

    def alloc(size):
        nonlocal next_id
        lines.append(f"a {next_id} {size} 0")
        next_id += 1
        return next_id - 1

    def free(ident):
        lines.append(f"f {ident}")

    alloc(10 * MIB)
    carried = {}
    for k in range(steps):
        step_body(k, alloc, free, carried)
        for _ in range(PADDING):
            free(alloc(512))
    return f"{next_id} {len(lines)}\n" + "\n".join(lines) + "\n"


def three_blocks(_k, alloc, free, _carried):
    """A (100 MiB), B (60 MiB) while A lives, then C (40 MiB) after A: the peak is the weights,
    A and B, 170 MiB; C fits where A was, so a layout that repeats holds exactly that."""
    a = alloc(100 * MIB)
    b = alloc(60 * MIB)
    free(a)
    c = alloc(40 * MIB)
    free(b)
    free(c)


def prefetched_batch(_k, alloc, free, carried):
    """A (100 MiB) and B (60 MiB), then the next step's batch X (30 MiB) is allocated before
    this step's batch is freed: two batches live at once, so the layout repeats every two
    steps. Peak: weights, last step's X, A and B = 200 MiB."""
    a = alloc(100 * MIB)
    b = alloc(60 * MIB)
    free(a)
    x = alloc(30 * MIB)
    if "x" in carried:
        free(carried["x"])
    carried["x"] = x
    free(b)


def overlaps(arcs_a, arcs_b):
    return any(a < d and c < b for a, b in arcs_a for c, d in arcs_b)


class StepPlanBound(unittest.TestCase):
    def run_script(self, text):
        cli = stowage_cli()
        if cli is None:
            self.skipTest("build/stowage is not built")
        return run_on_file(SCRIPT, "t.rep", text,
                           lambda d, src: [src, "--stowage", cli, "--time-limit", "1"],
                           lambda d: None)[0]

    def row(self, out):
        rows = [line.split() for line in out.splitlines() if line.startswith("t.rep")]
        self.assertEqual(len(rows), 1, out)
        return rows[0]

    def test_a_loop_whose_step_packs_exactly_needs_its_peak(self):
        p = self.run_script(loop(12, three_blocks))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        name, period, peak, height, cut, cyclic, granules, steps = self.row(p.stdout)
        self.assertEqual(int(period), 6 + 2 * PADDING)
        self.assertEqual(int(peak), 170 * MIB)
        self.assertEqual(int(height), 170 * MIB)  # 85 granules of 2 MiB
        self.assertEqual((cut, cyclic, granules, steps), ("1.0000", "1.0000", "1.0000", "1"))
        self.assertIn("1 of 1 within 1.01 x live", p.stdout)

    def test_a_block_that_outlives_its_step_takes_a_cycle_of_two_steps(self):
        text = loop(12, prefetched_batch)
        p = self.run_script(text)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")  # the model holds the trace's peak
        name, period, peak, height, cut, cyclic, granules, steps = self.row(p.stdout)
        self.assertEqual(int(peak), 200 * MIB)
        self.assertEqual(steps, "2")
        # Both copies of X overlap each other and every copy of A and B: first fit puts them
        # above A (100) and B (60), so 10 + 100 + 60 + 2 x 30 = 230 MiB; the cut cycle gives
        # one X the whole cycle, the same height.
        self.assertEqual(int(height), 230 * MIB)

    def test_the_cyclic_layout_never_overlaps_blocks_that_live_at_once(self):
        rng = random.Random(7)
        for case in range(40):
            period = rng.randint(5, 60)
            cyclic = [(rng.randrange(period), rng.randint(1, period - 1), rng.randint(1, 9) * 512)
                      for _ in range(rng.randint(1, 30))]
            persistent = [rng.randint(1, 4) * 512 for _ in range(rng.randint(0, 3))]
            with self.subTest(case=case):
                height, placed = step_plan_bound.cyclic_first_fit(persistent, cyclic, period)
                self.assertEqual(len(placed), len(cyclic) + len(persistent))
                for i, (arcs_i, lo_i, hi_i) in enumerate(placed):
                    self.assertLessEqual(hi_i, height)
                    for arcs_j, lo_j, hi_j in placed[:i]:
                        if overlaps(arcs_i, arcs_j):
                            self.assertTrue(hi_i <= lo_j or hi_j <= lo_i)
                load = sum(persistent) + step_plan_bound.max_cyclic_load(cyclic, period)
                self.assertGreaterEqual(height, load)

    def test_a_trace_whose_end_does_not_repeat_is_skipped(self):
        lines = [f"a {i} {(i + 1) * 1000} 0" for i in range(200)] + [f"f {i}" for i in range(200)]
        p = self.run_script("200 400\n" + "\n".join(lines) + "\n")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("no repeating step, skipped", p.stdout)
        self.assertIn("0 of 0 within", p.stdout)

    def test_bad_input_names_file_line_and_reason(self):
        for text, message in [("1 2\na 0 512 0\nf 7\n", "t.rep:3: frees id 7, which is not live"),
                              ("", "t.rep:1: empty file")]:
            with self.subTest(message=message):
                p = self.run_script(text)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(message, p.stderr)
                self.assertNotIn("Traceback", p.stderr)


if __name__ == "__main__":
    unittest.main()
