"""Tests of bench/varlen_traces.py (BERT-like steps of a random sequence length) and
bench/loop_calls.py (backend calls per step of a loop after its first steps)."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

from script_runner import stowage_cli  # noqa: E402

import varlen_traces  # noqa: E402

BENCH = os.path.join(HERE, "..", "..", "bench")


class VarlenTraces(unittest.TestCase):
    def test_a_seed_gives_the_same_trace_and_every_free_matches_a_live_allocation(self):
        lines, lengths, ends = varlen_traces.trace_lines(3, 3)
        self.assertEqual((lines, lengths, ends), varlen_traces.trace_lines(3, 3))
        self.assertNotEqual(lengths, varlen_traces.trace_lines(4, 3)[1])
        self.assertTrue(all(32 <= n <= 512 for n in lengths))
        ids, events = map(int, lines[0].split())
        self.assertEqual(events, len(lines) - 1)
        self.assertEqual(ends[-1], events)
        live = set()
        for line in lines[1:]:
            f = line.split()
            if f[0] == "a":
                self.assertNotIn(int(f[1]), live)
                self.assertGreater(int(f[2]), 0)
                live.add(int(f[1]))
            else:
                live.remove(int(f[1]))  # KeyError: a free of nothing live
        self.assertEqual(len(set(int(l.split()[1]) for l in lines[1:] if l[0] == "a")), ids)
        # What stays between steps: the weights and AdamW's two moments (BERT-base's
        # 110 M parameters in fp32: about 1.3 GB in all).
        sizes = {}
        for line in lines[1:]:
            f = line.split()
            if f[0] == "a":
                sizes[int(f[1])] = int(f[2])
        kept = sum(sizes[i] for i in live)
        self.assertTrue(1.2e9 < kept < 1.5e9, kept)

    def test_a_step_holds_about_the_same_tokens_whatever_its_length(self):
        # The largest request is the logits (or their log-softmax): tokens x vocab x 4 bytes.
        for seed in (0, 1):
            lines, lengths, _ = varlen_traces.trace_lines(seed, 1)
            biggest = max(int(l.split()[2]) for l in lines[1:] if l[0] == "a")
            tokens = (12288 // lengths[0]) * lengths[0]
            self.assertEqual(biggest, tokens * 30522 * 4)

    def test_markers_come_before_each_step_and_are_not_events(self):
        lines, lengths, ends = varlen_traces.trace_lines(1, 3)
        marked = varlen_traces.with_markers(lines, ends, "train", lengths)
        self.assertEqual(marked[0], lines[0])
        self.assertEqual([l for l in marked if l != "m train"], lines)
        at = [i for i, l in enumerate(marked[1:]) if l == "m train"]
        self.assertEqual(at, [0, ends[0] + 1, ends[1] + 2])

    def test_padded_lengths_fall_on_the_buckets_and_name_their_keys(self):
        lines, lengths, ends = varlen_traces.trace_lines(2, 6, pad_to=64)
        self.assertTrue(all(l % 64 == 0 and 64 <= l <= 512 for l in lengths), lengths)
        self.assertNotEqual(lengths, varlen_traces.trace_lines(2, 6)[1])
        marked = varlen_traces.with_markers(lines, ends, "len{len}", lengths)
        keys = [l[2:] for l in marked if l.startswith("m ")]
        self.assertEqual(keys, ["len%d" % l for l in lengths])

    def test_bad_arguments_are_refused(self):
        for args in (["--steps", "0"], ["--max-len", "600"], ["--seeds", "x"],
                     ["--markers", "a b"], ["--pad-to", "0"]):
            p = subprocess.run([sys.executable, os.path.join(BENCH, "varlen_traces.py"), "out"]
                               + args, capture_output=True, text=True)
            self.assertEqual(p.returncode, 2, args)

    @unittest.skipIf(stowage_cli() is None, "no stowage CLI built")
    def test_loop_calls_counts_the_calls_after_the_first_steps(self):
        p = subprocess.run([sys.executable, os.path.join(BENCH, "loop_calls.py"), "--stowage",
                            stowage_cli(), "--varlen", "0:1", "--varlen-steps", "5",
                            "--random", "0:1", "--random-steps", "6"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [l.split("|") for l in p.stdout.splitlines() if l.startswith("| bert") or
                l.startswith("| r0")]
        self.assertEqual(len(rows), 2)
        self.assertEqual([r[2].strip() for r in rows], ["3", "2"])  # steps after the first 3: r0, then bert
        self.assertIn("classic: 2 loops; more than one backend call per ten steps", p.stdout)


if __name__ == "__main__":
    unittest.main()
