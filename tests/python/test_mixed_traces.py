"""Tests of bench/mixed_traces.py: two traces interleaved in one, on small traces built here."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SCRIPT = os.path.join(ROOT, "bench", "mixed_traces.py")
sys.path.insert(0, HERE)

from script_runner import stowage_cli  # noqa: E402

spec = importlib.util.spec_from_file_location("mixed_traces", SCRIPT)
mixed_traces = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mixed_traces)

# A: 4 events on stream 0; B: 2 events, one of them on stream 1.
A = "2 4\na 0 1000 0\na 1 2000 0\nf 0\nf 1\n"
B = "1 2\na 0 5000 1\nf 0\n"


def run(src_files, *args):
    """Writes src_files ({name: text}) to a source directory, runs the script on it and returns
    (process, {output name: text})."""
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "src"), os.path.join(d, "out")
        os.mkdir(src)
        for name, text in src_files.items():
            with open(os.path.join(src, name), "w") as f:
                f.write(text)
        p = subprocess.run([sys.executable, SCRIPT, out, "--src", src, *args],
                           capture_output=True, text=True)
        outputs = {}
        if os.path.isdir(out):
            for name in os.listdir(out):
                with open(os.path.join(out, name)) as f:
                    outputs[name] = f.read()
        return p, outputs


class Mix(unittest.TestCase):
    def test_event_by_event_in_proportion(self):
        ids, events = mixed_traces.mix(mixed_traces.parse("a", A), mixed_traces.parse("b", B),
                                       1, False)
        self.assertEqual(ids, 3)
        # Turn k takes A up to 4k/4 and B up to 2k/4: B's events after A's 2nd and 4th.
        self.assertEqual(events, [("a", 0, 1000, 0), ("a", 1, 2000, 0), ("a", 2, 5000, 1),
                                  ("f", 0), ("f", 1), ("f", 2)])

    def test_chunks_take_turns(self):
        _, events = mixed_traces.mix(mixed_traces.parse("a", A), mixed_traces.parse("b", B),
                                     4, False)
        # One turn of four events: all of A, then all of B.
        self.assertEqual(events, [("a", 0, 1000, 0), ("a", 1, 2000, 0), ("f", 0), ("f", 1),
                                  ("a", 2, 5000, 1), ("f", 2)])

    def test_a_mix_beyond_the_format_is_refused(self):
        top = mixed_traces.parse("b", "1 2\na 0 5000 65535\nf 0\n")
        with self.assertRaisesRegex(mixed_traces.TraceError, "stream index 131071"):
            mixed_traces.mix(top, top, 1, True)
        mixed_traces.mix(top, top, 1, False)  # the same streams: within the format

    def test_separate_streams_move_past_the_first_traces(self):
        _, events = mixed_traces.mix(mixed_traces.parse("b", B), mixed_traces.parse("a", A),
                                     1, True)
        # B (stream 1) comes first, so A's stream 0 becomes 2.
        self.assertEqual(sorted({e[3] for e in events if e[0] == "a"}), [1, 2])


class Script(unittest.TestCase):
    def test_every_pair_chunk_and_stream_choice(self):
        p, out = run({"a.rep": A, "b.rep": B, "c.rep": B})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(out), 3 * 2 * 2)  # pairs a+b, a+c, b+c; chunks 1, 1000; 2 stream choices
        self.assertEqual(out["a+b_c1000_same.rep"],
                         "3 6\na 0 1000 0\na 1 2000 0\nf 0\nf 1\na 2 5000 1\nf 2\n")

    @unittest.skipIf(stowage_cli() is None, "no stowage CLI built")
    def test_the_replay_reads_what_it_writes(self):
        p, out = run({"a.rep": A, "b.rep": B}, "--chunks", "1", "--streams", "separate")
        self.assertEqual(p.returncode, 0, p.stderr)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.rep")
            with open(path, "w") as f:
                f.write(out["a+b_c1_separate.rep"])
            r = subprocess.run([stowage_cli(), "replay", "--policy", "classic", "--json", path],
                               capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('"peak_live_bytes": 8000', r.stdout)  # 1000 + 2000 + 5000 live together

    def test_malformed_trace_names_file_and_line(self):
        p, out = run({"a.rep": A, "b.rep": "1 2\na 0 5000 1\nq 0\n"})
        self.assertEqual(p.returncode, 2)
        self.assertRegex(p.stderr, r"b\.rep:3: expected 'a ID SIZE STREAM' or 'f ID'")
        self.assertEqual(out, {})

    def test_header_count_and_ids_are_checked(self):
        for text, why in (("1 3\na 0 5000 1\nf 0\n", "header says 3 events, the file has 2"),
                          ("1 2\na 1 5000 1\nf 1\n", "id 1 not below the header's 1"),
                          ("", "empty trace"),
                          ("1 2\na 0 0 1\nf 0\n", "size 0 is not in [1, 2^62]"),
                          ("1 2\na 0 4611686018427387905 1\nf 0\n", "is not in [1, 2^62]"),
                          ("1 2\na 0 5000 65536\nf 0\n", "stream index 65536 too large")):
            p, _ = run({"a.rep": A, "b.rep": text})
            self.assertEqual(p.returncode, 2, text)
            self.assertIn(why, p.stderr)

    def test_bad_arguments(self):
        for args, why in ((["--chunks", "0"], "--chunks must be at least 1"),
                          (["--chunks", "x"], "is not a comma-separated list"),
                          (["--streams", "both"], "--streams takes same and/or separate"),
                          (["--pairs", "a+zz"], "'a+zz' is not two traces")):
            p, out = run({"a.rep": A, "b.rep": B}, *args)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn(why, p.stderr)
            self.assertEqual(out, {})


if __name__ == "__main__":
    unittest.main()
