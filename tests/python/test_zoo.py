"""Tests of the corpus of model workloads (bench/zoo): the index against the traces on disk and
the table of models, the failures' reasons, and one workload recorded again where torch is
importable."""

import csv
import gzip
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
ZOO = os.path.join(ROOT, "bench", "zoo")
sys.path.insert(0, HERE)
sys.path.insert(0, ZOO)

from script_runner import stowage_cli  # noqa: E402

import build  # noqa: E402
import models  # noqa: E402


def rows(path):
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        return r.fieldnames, list(r)


class Index(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fields, cls.index = rows(build.INDEX)
        cls.failure_fields, cls.failures = rows(build.FAILURES)

    def test_the_columns_are_those_of_the_index_and_the_failures(self):
        self.assertEqual(self.fields, build.INDEX_FIELDS)
        self.assertEqual(self.failure_fields, build.FAILURE_FIELDS)

    def test_every_workload_of_the_table_is_indexed_or_failed_once(self):
        want = {(m.name, mode, b) for m, mode, b in models.workloads()}
        got = [(r["model"], r["mode"], int(r["batch"])) for r in self.index + self.failures]
        self.assertEqual(len(got), len(set(got)), "a workload listed twice")
        self.assertEqual(set(got), want)

    def test_every_failure_has_a_reason(self):
        for r in self.failures:
            self.assertTrue(r["reason"].strip(), r)

    def test_the_corpus_has_100_architectures_of_the_three_libraries(self):
        self.assertGreaterEqual(len({r["model"] for r in self.index}), 100)
        libraries = {r["library"] for r in self.index}
        self.assertLessEqual({"torchvision", "timm", "transformers"}, libraries)
        self.assertLessEqual(libraries, {"torchvision", "timm", "transformers", "diffusers"})
        for r in self.index:
            self.assertEqual(r["library"], models.by_name(r["model"]).library, r)

    def test_every_trace_on_disk_is_indexed_and_every_indexed_trace_is_on_disk(self):
        on_disk = set()
        for dp, _, files in os.walk(build.TRACES):
            for f in files:
                rel = os.path.relpath(os.path.join(dp, f), build.TRACES)
                if f.endswith(".rep.tags.gz"):
                    rel = rel[:-len(".tags.gz")] + ".gz"
                else:
                    self.assertTrue(f.endswith(".rep.gz"), rel)
                on_disk.add(rel)
        indexed = {r["trace"] for r in self.index}
        self.assertEqual(on_disk, indexed)
        for r in self.index:
            m = models.by_name(r["model"])
            self.assertEqual(r["trace"], models.trace_name(m, r["mode"], int(r["batch"])))

    def test_the_training_runs_are_the_indexed_train_and_train_ckpt_workloads(self):
        p = subprocess.run([sys.executable, os.path.join(ZOO, "build.py"), "--training"],
                           capture_output=True, text=True, check=True)
        want = [os.path.join(build.TRACES, r["trace"]) for r in self.index
                if r["mode"] in ("train", "train-ckpt")]
        self.assertEqual(p.stdout.split(), want)
        self.assertGreater(len(want), 100)
        self.assertTrue(all(os.path.exists(t) for t in want))

    def test_every_row_has_the_events_and_peak_of_its_trace(self):
        for r in self.index:
            events, peak = build.gz_figures(os.path.join(build.TRACES, r["trace"]))
            self.assertEqual((int(r["events"]), int(r["peak_live_bytes"])), (events, peak),
                             r["trace"])
            self.assertGreater(events, 0)


class Figures(unittest.TestCase):
    def test_peak_live_is_the_largest_sum_of_live_sizes(self):
        lines = ["3 5", "a 0 100 0", "# a comment", "a 1 50 1", "f 0", "m train", "a 2 60 0",
                 "e", "f 2"]
        self.assertEqual(build.trace_figures(lines), (5, 150))

    def test_an_event_count_that_is_not_the_header_s_is_refused(self):
        with self.assertRaises(ValueError):
            build.trace_figures(["1 2", "a 0 8 0"])

    def test_varlen_lengths_are_fixed_by_the_model(self):
        m = models.by_name("bert-base")
        a = models.seq_lengths(m, models.VARLEN_STEPS)
        self.assertEqual(a, models.seq_lengths(m, models.VARLEN_STEPS))
        self.assertTrue(all(8 <= n <= m.opts["seq"] for n in a))
        self.assertGreater(len(set(a)), 1)


@unittest.skipUnless(stowage_cli(), "the stowage CLI is not built (make build)")
class Replay(unittest.TestCase):
    def replay(self, path):
        p = subprocess.run([stowage_cli(), "replay", "--policy", "classic", "--json",
                            "--repeats", "1", path], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout.splitlines()[0])

    def test_the_cli_reads_a_committed_trace_and_its_unpacked_copy_alike(self):
        _, index = rows(build.INDEX)
        r = min(index, key=lambda r: int(r["events"]))
        committed = self.replay(os.path.join(build.TRACES, r["trace"]))
        self.assertEqual((committed["events"], committed["peak_live_bytes"]),
                         (int(r["events"]), int(r["peak_live_bytes"])))
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([sys.executable, os.path.join(ZOO, "build.py"), "--unpack", d,
                            "--models", r["model"]], check=True, capture_output=True)
            plain = self.replay(os.path.join(d, os.path.basename(r["trace"])[:-3]))
        for key in ("events", "peak_live_bytes", "peak_reserved_bytes", "backend_calls"):
            self.assertEqual(committed[key], plain[key], key)

    def test_report_finds_the_compressed_tags_beside_a_committed_trace(self):
        _, index = rows(build.INDEX)
        r = min(index, key=lambda r: int(r["events"]))
        trace = os.path.join(build.TRACES, r["trace"])
        self.assertTrue(os.path.exists(trace[:-3] + ".tags.gz"), trace)
        with tempfile.TemporaryDirectory() as d:
            page = os.path.join(d, "r.html")
            p = subprocess.run([stowage_cli(), "report", trace, "-o", page], capture_output=True,
                               text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(page) as f:
                html = f.read()
        self.assertNotIn("this trace has no tags file", html)


def torch_missing():
    for mod in ("torch", "torchvision"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not importable (python/requirements.txt, make deps)"
    return None


RECORD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import build, models
record = build.recorder()  # before torch: the emulated card loads first
m = models.Model("zoo-test-resnet18", "torchvision", "image", models.tv("resnet18"), (2, 4))
with record(gpu=build.GPU) as rec:
    build.run_workload(m, "train", 2, build.DEVICE)
rec.save(sys.argv[2])
print(json.dumps({"events": rec.events, "peak_live_bytes": rec.peak_live_bytes}))
"""


@unittest.skipIf(torch_missing(), torch_missing() or "")
class Record(unittest.TestCase):
    def test_a_small_workload_records_and_its_figures_are_those_of_its_trace(self):
        import json
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.rep")
            p = subprocess.run([sys.executable, "-c", RECORD, ZOO, path], capture_output=True,
                               text=True, cwd=d)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            got = json.loads(p.stdout.splitlines()[-1])
            with open(path) as f:
                events, peak = build.trace_figures(f)
        self.assertEqual((got["events"], got["peak_live_bytes"]), (events, peak))
        # weights, gradients and AdamW's two moments of ResNet-18's 11.7 M fp32 parameters
        self.assertGreater(peak, 4 * 4 * 11_000_000)
        self.assertGreater(events, 1000)  # 3 steps


if __name__ == "__main__":
    unittest.main()
