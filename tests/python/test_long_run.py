"""Tests of bench/long_run.py (a training trace run for more steps) on traces built here."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "long_run.py")
sys.path.insert(0, HERE)

from script_runner import run_on_file  # noqa: E402


def training_trace(steps):
    """Weights (ids 0-1, never freed), then `steps` identical steps: a big
    activation, smaller ones, a block that lives into the next step (freed
    there), then the end of the run (the weights freed). Returns the event
    lines (without header) and the number of ids."""
    lines, next_id, carried = [], 0, None

    def alloc(size):
        nonlocal next_id
        lines.append(f"a {next_id} {size} 0")
        next_id += 1
        return next_id - 1

    weights = [alloc(4 << 20), alloc(1 << 20)]
    for _ in range(steps):
        big = alloc(300 << 20)
        small = [alloc(512 * (k + 1)) for k in range(30)]
        if carried is not None:
            lines.append(f"f {carried}")
        for s in reversed(small):
            lines.append(f"f {s}")
        carried = alloc(8 << 20)  # freed in the next step
        lines.append(f"f {big}")
    lines.append(f"f {carried}")
    for w in weights:
        lines.append(f"f {w}")
    return lines, next_id


def parse(path):
    with open(path) as f:
        ids, events = (int(x) for x in f.readline().split())
        body = [line.split() for line in f]
    return ids, events, body


class LongRun(unittest.TestCase):
    def run_script(self, text, *extra):
        def result(d):
            dst = os.path.join(d, "out", "t_long.rep")
            return parse(dst) if os.path.exists(dst) else None

        return run_on_file(SCRIPT, "t.rep", text,
                           lambda d, src: [os.path.join(d, "out"), src] + list(extra), result)

    def test_repeats_the_last_step_and_keeps_the_weights(self):
        lines, ids = training_trace(4)
        p, result = self.run_script(f"{ids} {len(lines)}\n" + "\n".join(lines) + "\n",
                                    "--steps", "5")
        self.assertEqual(p.returncode, 0, p.stderr)
        step = 1 + 30 + 1 + 30 + 1 + 1  # big, 30 small, carried free, 30 frees, new carried, big free
        self.assertIn(f"step of {step} events", p.stdout)
        out_ids, out_events, body = result
        self.assertEqual(out_events, len(body))
        self.assertEqual(out_ids, sum(1 for e in body if e[0] == "a"))
        # Every free names a live allocation; ids are dense and in order.
        live, seen = {}, 0
        for e in body:
            if e[0] == "a":
                self.assertEqual(int(e[1]), seen)
                live[int(e[1])] = int(e[2])
                seen += 1
            else:
                self.assertIn(int(e[1]), live, "free of an id that is not live")
                del live[int(e[1])]
        # The weights stay live (the end of the run is not written), and so
        # does the block each step hands to the next.
        self.assertEqual(sorted(live.values()), [1 << 20, 4 << 20, 8 << 20])
        # Four recorded steps and five more: nine big activations.
        self.assertEqual(sum(1 for e in body if e[0] == "a" and int(e[2]) == 300 << 20), 9)

    def test_markers_come_before_each_step_where_the_fewest_bytes_are_live(self):
        lines, ids = training_trace(4)
        text = f"{ids} {len(lines)}\n" + "\n".join(lines) + "\n"
        p, plain = self.run_script(text, "--steps", "5")
        self.assertEqual(p.returncode, 0, p.stderr)
        p, result = self.run_script(text, "--steps", "5", "--markers", "train")
        self.assertEqual(p.returncode, 0, p.stderr)
        out_ids, out_events, body = result
        events = [e for e in body if e[0] not in ("m", "e")]
        self.assertEqual((out_ids, out_events, events), plain, "markers add no event")
        # The least loaded phase of a step is before its big activation (the
        # carried block alone is live there): a marker before every big
        # allocation of the periodic stretch (steps 2-4) and of the 5 copies.
        marks = [i for i, e in enumerate(body) if e[0] == "m"]
        self.assertEqual(len(marks), 3 + 5)
        for i in marks:
            self.assertEqual(body[i], ["m", "train"])
            self.assertEqual(body[i + 1][0], "a")
            self.assertEqual(int(body[i + 1][2]), 300 << 20)
        p, _ = self.run_script(text, "--markers", "bad key")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--markers", p.stderr)

    def test_trace_without_a_repeating_step_is_skipped(self):
        lines = [f"a {i} {(i + 1) * 1000} 0" for i in range(200)] + [f"f {i}" for i in range(200)]
        p, result = self.run_script(f"200 400\n" + "\n".join(lines) + "\n")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("no repeating step, skipped", p.stdout)
        self.assertIsNone(result)

    def test_bad_input_names_file_line_and_reason(self):
        cases = [
            ("2 2\na 0 512 0\nx 1\n", "t.rep:3: expected"),
            ("1 2\na 0 12x 0\nf 0\n", "t.rep:2: expected"),
            ("1 2\na 0 512 0\nf 7\n", "t.rep:3: frees id 7, which is not live"),
            ("1 3\na 0 512 0\nf 0\nf 0\n", "t.rep:4: frees id 0, which is not live"),
            ("1 3\na 0 512 0\na 0 512 0\nf 0\n", "t.rep:3: id 0 allocated again while live"),
            ("1 3\na 0 512 0\nf 0\n", "t.rep:1: the header says 3 events, the file has 2"),
            ("1 2\na 0 0 0\nf 0\n", "t.rep:2: an allocation of 0 bytes"),
            ("1 2\na 0 5\u00b2 0\nf 0\n", "t.rep:2: not ASCII text"),
            (b"1 2\na 0 512 0\nf \xff\n", "t.rep:3: not ASCII text"),
            ("", "t.rep:1: empty file"),
        ]
        for text, message in cases:
            with self.subTest(message=message):
                p, result = self.run_script(text)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(message, p.stderr)
                self.assertNotIn("Traceback", p.stderr)
                self.assertIsNone(result)

if __name__ == "__main__":
    unittest.main()
