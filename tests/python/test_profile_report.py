"""Tests of bench/gpu/sampler.c and bench/gpu/profile_report.py (run.sh part 7): a program
built here with -g spins in two functions, one three times as long as the other, under the
preloaded sampler; the report must find both, the longer one with more samples, in one
profile, in a gzipped one, and in the two-profile comparison."""

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SAMPLER = os.path.join(ROOT, "bench", "gpu", "sampler.c")
REPORT = os.path.join(ROOT, "bench", "gpu", "profile_report.py")

SPIN = r"""
#include <stdint.h>
#include <time.h>
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
__attribute__((noinline)) uint64_t spin_long(double seconds) {
    uint64_t x = 1;
    for (double end = now() + seconds; now() < end;)
        for (int i = 0; i < 1000; i++) x = x * 6364136223846793005ull + 1;
    return x;
}
__attribute__((noinline)) uint64_t spin_short(double seconds) {
    uint64_t x = 3;
    for (double end = now() + seconds; now() < end;)
        for (int i = 0; i < 1000; i++) x = x * 2862933555777941757ull + 7;
    return x;
}
int main(void) { return (int)((spin_long(0.45) ^ spin_short(0.15)) & 1); }
"""


def counts(report, section):
    """{name: samples per 1000} of one section of the report (the last column before it)."""
    out, on = {}, False
    for line in report.splitlines():
        if line.startswith("== by "):
            on = line.startswith("== by " + section)
            continue
        if on and line.strip():
            fields = line.split()
            out[fields[-1]] = [float(x) for x in fields[:-1]]
    return out


@unittest.skipUnless(shutil.which("gcc") and shutil.which("addr2line"), "needs gcc and addr2line")
class ProfileReport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.so = os.path.join(cls.dir, "sampler.so")
        cls.prog = os.path.join(cls.dir, "spin")
        src = os.path.join(cls.dir, "spin.c")
        with open(src, "w") as f:
            f.write(SPIN)
        subprocess.run(["gcc", "-O2", "-fPIC", "-shared", SAMPLER, "-o", cls.so, "-lrt"],
                       check=True)
        subprocess.run(["gcc", "-O1", "-g", src, "-o", cls.prog], check=True)
        cls.profile = os.path.join(cls.dir, "prof.txt")
        env = dict(os.environ, LD_PRELOAD=cls.so, STOW_SAMPLER_OUT=cls.profile,
                   STOW_SAMPLER_HZ="2000")
        p = subprocess.run([cls.prog], env=env, capture_output=True, text=True)
        assert "samples ->" in p.stderr, p.stderr

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def report(self, *profiles):
        p = subprocess.run([sys.executable, REPORT, self.prog, *profiles], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout

    def test_the_longer_function_has_more_samples(self):
        out = self.report(self.profile)
        funcs = counts(out, "function")
        self.assertIn("spin_long", funcs)
        self.assertIn("spin_short", funcs)
        self.assertGreater(funcs["spin_long"][0], funcs["spin_short"][0])
        self.assertGreater(funcs["spin_long"][0] + funcs["spin_short"][0], 500)  # of 1000
        self.assertIn("spin.c", counts(out, "file"))

    def test_a_gzipped_profile_and_a_comparison(self):
        gz = self.profile + ".gz"
        with open(self.profile, "rb") as f, gzip.open(gz, "wb") as g:
            g.write(f.read())
        same = counts(self.report(self.profile, gz), "function")
        # Two columns and their difference: the same profile twice differs by nothing.
        self.assertEqual(len(same["spin_long"]), 3)
        self.assertEqual(same["spin_long"][0], same["spin_long"][1])
        self.assertEqual(same["spin_long"][2], 0.0)

    def test_samples_outside_the_binary_are_counted_apart(self):
        with open(self.profile) as f:
            text = f.read()
        stray = os.path.join(self.dir, "stray.txt")
        with open(stray, "w") as f:
            f.write(text + "pc 10\npc 20\n")
        first = self.report(self.profile).splitlines()[0]
        second = self.report(stray).splitlines()[0]
        outside = lambda line: int(line.split(", ")[1].split()[0])
        self.assertEqual(outside(second), outside(first) + 2)

    def test_a_malformed_profile_is_refused_with_its_file_and_line(self):
        with open(self.profile) as f:
            first = f.readline()
        bad = os.path.join(self.dir, "bad.txt")
        with open(bad, "w") as f:
            f.write(first + "pc not-hex\n")
        p = subprocess.run([sys.executable, REPORT, self.prog, bad], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("bad.txt:2:", p.stderr)
        self.assertEqual(p.stdout, "")

    def test_a_bad_rate_is_refused(self):
        out = os.path.join(self.dir, "never.txt")
        env = dict(os.environ, LD_PRELOAD=self.so, STOW_SAMPLER_OUT=out, STOW_SAMPLER_HZ="4k")
        p = subprocess.run(["true"], env=env, capture_output=True, text=True)
        self.assertIn("STOW_SAMPLER_HZ '4k' is not 1..100000", p.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
