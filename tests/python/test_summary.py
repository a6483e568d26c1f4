"""tests/check/summary.py, the closing count of `make test`, on canned outputs:
Criterion programs at verbosity 1, the unittest runner's lines, ctest's JUnit
file (skips by SKIP_RETURN_CODE, a missing program, a failure by regular
expression) and all.sh's checks.txt.

    python3 -m unittest tests/python/test_summary.py -v
"""
import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "check", "summary.py")
_spec = importlib.util.spec_from_file_location("stow_summary", SCRIPT)
summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summary)

# Criterion 2.4.1, --jobs 2, CRITERION_VERBOSITY_LEVEL=1: a pass, a failure, a
# crash, two skips (one without a reason), a disabled test; one log line ends
# up on another's tail, as workers printing together leave it.
CRITERION = textwrap.dedent("""\
    [----] Criterion v2.4.1
    [====] Running 5 tests from s:
    [RUN ] s::crash
    [RUN ] s::fail
    [----] t.c:4: Assertion Failed
    [----]   boom
    [FAIL] s::fail: (0.00s)
    [----] t.c:5: Unexpected signal caught below this line!
    [FAIL] s::crash: CRASH!
    [RUN ] s::pass
    [PASS] s::pass: (0.01s)
    [RUN ] s::skip
    [RUN ] s::skip2
    worker output without a newline[SKIP] s::skip2: Test was skipped
    [SKIP] s::skip: CUDA unavailable: cuInit failed (no device)
    [====] Running 2 tests from t:
    [SKIP] t::disabled: Test is disabled
    [RUN ] t::pass2
    [PASS] t::pass2: (0.00s)
    [====] Synthesis: Tested: 4 | Passing: 2 | Failing: 2 | Crashing: 1 
    """)

CRITERION_CLEAN = textwrap.dedent("""\
    [----] Criterion v2.4.1
    [====] Running 2 tests from pool:
    [RUN ] pool::a
    [PASS] pool::a: (0.00s)
    [RUN ] pool::b
    [SKIP] pool::b: shared trace ../shared/traces/gpt2.rep not found next to the project
    [====] Synthesis: Tested: 1 | Passing: 1 | Failing: 0 | Crashing: 0 
    """)

# summary.py unittest: unittest's own -v lines on stderr, then its result lines.
UNITTEST = textwrap.dedent("""\
    test_ok (test_a.A.test_ok) ... ok
    test_skip (test_a.A.test_skip) ... skipped 'no GPU: cuInit failed'
    setUpClass (test_a.C) ... skipped 'class level: no build'
    ----------------------------------------------------------------------
    Ran 3 tests in 0.001s

    OK (skipped=2)
    unittest result: 5 passed, 0 failed, 2 skipped
    unittest skipped: test_a.A.test_skip: no GPU: cuInit failed
    unittest skipped: setUpClass (test_a.C): class level: no build
    """)


# python3 -m unittest discover -v, the whole module skipped; then one run with a failure.
PLAIN_SKIPPED = textwrap.dedent("""\
    test_torch_adapter (unittest.loader.ModuleSkipped.test_torch_adapter) ... skipped "torch is not importable (No module named 'torch')"

    ----------------------------------------------------------------------
    Ran 1 test in 0.010s

    OK (skipped=1)
    """)
PLAIN_RUN = textwrap.dedent("""\
    test_a (test_t.A.test_a) ... ok
    test_b (test_t.A.test_b) ... FAIL
    test_c (test_t.A.test_c) ... skipped 'needs a GPU'
    test_d (test_t.A.test_d) ... ok

    ----------------------------------------------------------------------
    Ran 4 tests in 0.010s

    FAILED (failures=1, skipped=1)
    """)


def case(name, status, out, skipped=None, failure=None):
    inner = ""
    if skipped is not None:
        inner += f'<skipped message="{escape(skipped)}"/>'
    if failure is not None:
        inner += f'<failure message="{escape(failure)}"/>'
    return (f'<testcase name="{name}" classname="{name}" time="0.1" status="{status}">{inner}'
            f"<system-out>{escape(out)}</system-out></testcase>")


def junit(*cases):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="x" tests="1">'
            + "".join(cases) + "</testsuite>")


class Criterion(unittest.TestCase):
    def test_counts_each_test_and_names_each_skip_with_its_reason(self):
        t = summary.parse_criterion("test_x", CRITERION)
        self.assertEqual(t.passed, 2)
        self.assertEqual(t.failed, [("test_x s::fail", "failed"), ("test_x s::crash", "crashed")])
        self.assertEqual(t.skipped, [("test_x s::skip2", "Test was skipped"),
                                     ("test_x s::skip", "CUDA unavailable: cuInit failed (no device)"),
                                     ("test_x t::disabled", "Test is disabled")])

    def test_no_synthesis_line_is_no_criterion_output(self):
        self.assertIsNone(summary.parse_criterion("p", "[RUN ] s::a\nSegmentation fault\n"))


class Unittest(unittest.TestCase):
    def test_reads_the_runner_lines(self):
        t = summary.parse_unittest("python_tests", UNITTEST)
        self.assertEqual((t.passed, t.failed), (5, []))
        self.assertEqual(t.skipped, [
            ("python_tests test_a.A.test_skip", "no GPU: cuInit failed"),
            ("python_tests setUpClass (test_a.C)", "class level: no build")])

    def test_the_runner_counts_every_outcome(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "test_canned.py"), "w") as f:
                f.write(textwrap.dedent("""\
                    import sys, unittest
                    class A(unittest.TestCase):
                        def test_ok(self): pass
                        def test_noisy(self): sys.stderr.write("no newline")
                        def test_fail(self): self.assertEqual(1, 2)
                        def test_error(self): raise RuntimeError("x")
                        def test_skip(self): self.skipTest("needs a GPU: none here")
                        @unittest.expectedFailure
                        def test_expected(self): self.assertTrue(False)
                    @unittest.skipUnless(False, "needs ../shared/traces")
                    class B(unittest.TestCase):
                        def test_1(self): pass
                    class C(unittest.TestCase):
                        @classmethod
                        def setUpClass(cls): raise unittest.SkipTest("not built")
                        def test_1(self): pass
                    """))
            r = subprocess.run([sys.executable, SCRIPT, "unittest", d], capture_output=True,
                               text=True, timeout=120)
        self.assertEqual(r.returncode, 1, r.stderr)
        t = summary.parse_unittest("py", r.stdout + r.stderr)
        self.assertEqual(t.passed, 3)
        self.assertEqual(sorted(n for n, _ in t.failed),
                         ["py test_canned.A.test_error", "py test_canned.A.test_fail"])
        self.assertEqual(sorted(t.skipped), [
            ("py setUpClass (test_canned.C)", "not built"),
            ("py test_canned.A.test_skip", "needs a GPU: none here"),
            ("py test_canned.B.test_1", "needs ../shared/traces")])


class PlainUnittest(unittest.TestCase):
    def test_counts_from_the_closing_lines_and_reasons_from_the_skip_lines(self):
        t = summary.parse_plain_unittest("adapter", PLAIN_RUN)
        self.assertEqual((t.passed, t.failed), (2, [("adapter", "a test failed")]))
        self.assertEqual(t.skipped, [("adapter test_c (test_t.A.test_c)", "needs a GPU")])

    def test_a_ctest_skip_takes_the_reason_unittest_gave(self):
        t = summary.parse_junit(junit(case("torch_adapter_tests", "notrun", PLAIN_SKIPPED,
                                           skipped="SKIP_REGULAR_EXPRESSION_MATCHED")))
        self.assertEqual((t.passed, t.failed), (0, []))
        self.assertEqual(t.skipped, [("torch_adapter_tests",
                                      "torch is not importable (No module named 'torch')")])


class Ctest(unittest.TestCase):
    def test_junit_entries(self):
        t = summary.parse_junit(junit(
            case("test_x", "fail", CRITERION, failure=""),
            case("test_pool", "run", CRITERION_CLEAN),
            case("python_tests", "run", UNITTEST),
            case("install_consumer", "run", "installed\n"),
            case("gpu_smoke", "notrun", "gpu_smoke: no GPU (nvidia-smi absent)\n",
                 skipped="SKIP_RETURN_CODE=77"),
            case("traces", "notrun", "no ../shared/traces\n",
                 skipped="SKIP_REGULAR_EXPRESSION_MATCHED"),
            case("gone", "notrun", "Unable to find executable: /x/gone", skipped="Unable to find executable"),
            case("replay_cuda_fake_driver", "fail", "driver rule violation\n",
                 failure="Error regular expression found in output. Regex=[violation]"),
            case("old", "disabled", "")))
        # 2 + 1 + 5 Criterion/unittest passes, install_consumer.
        self.assertEqual(t.passed, 9)
        self.assertEqual([n for n, _ in t.failed],
                         ["test_x s::fail", "test_x s::crash", "gone", "replay_cuda_fake_driver"])
        self.assertIn(("gpu_smoke", "gpu_smoke: no GPU (nvidia-smi absent)"), t.skipped)
        self.assertIn(("traces", "no ../shared/traces"), t.skipped)
        self.assertIn(("old", "disabled in ctest"), t.skipped)
        self.assertEqual(len(t.skipped), 3 + 1 + 2 + 3)

    def test_a_failed_program_counts_a_failure_even_when_its_tests_pass(self):
        t = summary.parse_junit(junit(case("test_pool", "fail", CRITERION_CLEAN, failure="")))
        self.assertEqual(t.passed, 1)
        self.assertEqual([n for n, _ in t.failed], ["test_pool"])

    def test_a_program_without_synthesis_is_one_test(self):
        t = summary.parse_junit(junit(case("stress_threads", "run", "ok\n"),
                                      case("test_crash", "fail", "[RUN ] s::a\nSegmentation fault\n",
                                           failure="")))
        self.assertEqual((t.passed, t.failed), (1, [("test_crash", "Segmentation fault")]))

    def test_a_failed_program_is_named_with_the_line_that_says_why(self):
        out = "FAIL: exports differ: missing: stow_x\nstow_y\n"
        t = summary.parse_junit(junit(case("check_no_cuda_link", "fail", out, failure="")))
        self.assertEqual(t.failed, [("check_no_cuda_link", "FAIL: exports differ: missing: stow_x")])


class Report(unittest.TestCase):
    def report(self, files):
        with tempfile.TemporaryDirectory() as d:
            for name, text in files.items():
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = summary.report(d)
        return rc, out.getvalue().splitlines()

    def test_all_passing_ends_with_the_counts_and_lists_the_skips(self):
        rc, lines = self.report({
            "ctest.xml": junit(case("test_pool", "run", CRITERION_CLEAN),
                               case("python_tests", "run", UNITTEST)),
            "asan-ctest.xml": junit(case("test_pool", "run", CRITERION_CLEAN)),
            "checks.txt": "history ok 3\nasan ok 600\ntsan ok 90\nvalgrind ok 200\nfuzz ok 190\n"})
        self.assertEqual(rc, 0)
        self.assertEqual(lines[-1], "12 passed, 0 failed, 4 skipped")
        self.assertEqual(lines[:-1], [
            "skipped: test_pool pool::b: shared trace ../shared/traces/gpt2.rep not found next to the project",
            "skipped: python_tests test_a.A.test_skip: no GPU: cuInit failed",
            "skipped: python_tests setUpClass (test_a.C): class level: no build",
            "skipped: asan test_pool pool::b: shared trace ../shared/traces/gpt2.rep not found next to the project"])

    def test_a_failed_check_fails_and_is_listed(self):
        rc, lines = self.report({"ctest.xml": junit(case("a", "run", "")),
                                 "checks.txt": "history ok 3\nasan FAILED 600\n"})
        self.assertEqual(rc, 1)
        self.assertEqual(lines, ["FAILED: check asan: FAILED (tests/check/asan.sh)",
                                 "2 passed, 1 failed, 0 skipped"])

    def test_a_missing_result_file_is_a_failure(self):
        rc, lines = self.report({"checks.txt": "history ok 3\n"})
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("FAILED: ctest.xml: no "), lines)
        self.assertEqual(lines[-1], "1 passed, 1 failed, 0 skipped")


if __name__ == "__main__":
    unittest.main()
