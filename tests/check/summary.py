#!/usr/bin/env python3
"""tests/check/summary.py: the closing count of `make test`, test by test.

    summary.py report RESULTS_DIR
        Reads what `make test` leaves in RESULTS_DIR and prints one line per
        skipped test with its reason, one line per failed test, then
        "N passed, N failed, N skipped". Exits 1 if anything failed or a
        result file is missing.
    summary.py unittest TEST_DIR
        Runs `unittest discover` on TEST_DIR (verbosity 2, as `-v`) and ends
        with lines that the report reads: "unittest result: ...", then one
        "unittest skipped: TEST: REASON" or "unittest failed: TEST" per test.
        ctest's python_tests runs it.

RESULTS_DIR holds:
    ctest.xml       ctest --output-junit of the suite (with each test's output)
    asan-ctest.xml  the same for the ASan build's ctest run (tests/check/asan.sh)
    checks.txt      one line per check of tests/check/all.sh: NAME ok|FAILED SECONDS

How a ctest entry counts:
    a Criterion program: each of its tests, from its closing
        "Synthesis: Tested: T | Passing: P | Failing: F | Crashing: C" line
        (Failing includes Crashing; Tested leaves the skipped out) and its
        "[SKIP] suite::test: reason" lines (CRITERION_VERBOSITY_LEVEL=1);
    python_tests: each unittest test, from the lines above;
    another `python3 -m unittest -v` entry: each test, from unittest's closing counts,
        with the reasons of its "... skipped 'reason'" lines;
    any other entry: one test; skipped when ctest skipped it (SKIP_RETURN_CODE,
        SKIP_REGULAR_EXPRESSION; the reason is its last line of output) or it is
        disabled.
    An entry that ctest failed counts at least one failure, whatever its output says.
Each check of all.sh counts as one test.
Standard library only.
"""
import os
import re
import sys
import unittest
import xml.etree.ElementTree as ET

SYNTHESIS = re.compile(
    r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
# A Criterion log line may end up on another line's tail when workers print
# at the same time, so each is matched anywhere, up to the next tag.
_TAG = r"(?=\[(?:----|====|RUN |PASS|FAIL|SKIP|WARN|ERR )\]|\n|$)"
CRITERION_SKIP = re.compile(r"\[SKIP\] (\S+?): (.*?)" + _TAG)
CRITERION_FAIL = re.compile(r"\[FAIL\] (\S+?): (.*?)" + _TAG)
UNITTEST_RESULT = re.compile(r"^unittest result: (\d+) passed, (\d+) failed, (\d+) skipped\s*$",
                             re.M)
UNITTEST_SKIP = re.compile(r"^unittest skipped: (.*?): (.*)$", re.M)
UNITTEST_FAIL = re.compile(r"^unittest failed: (.*)$", re.M)
# Plain `python3 -m unittest -v` (an entry that does not run through summary.py unittest).
PLAIN_RAN = re.compile(r"^Ran (\d+) tests? in .*\n\s*\n(OK|FAILED)(?: \((.*)\))?\s*$", re.M)
PLAIN_SKIP = re.compile(r"^(\S+ \(.*?\)) \.\.\. skipped (['\"])(.*)\2\s*$", re.M)


class Tally:
    """Counts, and the name and reason of each skipped and failed test."""

    def __init__(self):
        self.passed = 0
        self.failed = []   # (name, reason)
        self.skipped = []  # (name, reason)

    def add(self, other):
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped

    def line(self):
        return f"{self.passed} passed, {len(self.failed)} failed, {len(self.skipped)} skipped"


def parse_criterion(name, out):
    """The tests of one Criterion program's output; None without a Synthesis line."""
    m = None
    for m in SYNTHESIS.finditer(out):
        pass
    if m is None:
        return None
    t = Tally()
    t.passed = int(m.group(2))
    fails = [(f"{name} {n}", "crashed" if r.startswith("CRASH") else "failed")
             for n, r in CRITERION_FAIL.findall(out)]
    failing = int(m.group(3))
    # The listed names, padded or cut to the synthesis's count.
    fails = fails[:failing] + [(name, "a test failed")] * (failing - len(fails))
    t.failed = fails
    t.skipped = [(f"{name} {n}", r.strip() or "skipped") for n, r in CRITERION_SKIP.findall(out)]
    return t


def parse_unittest(name, out):
    """The tests of summary.py unittest's output; None without its result line."""
    m = None
    for m in UNITTEST_RESULT.finditer(out):
        pass
    if m is None:
        return None
    t = Tally()
    t.passed = int(m.group(1))
    failing, skipping = int(m.group(2)), int(m.group(3))
    fails = [(f"{name} {n.strip()}", "failed") for n in UNITTEST_FAIL.findall(out)]
    t.failed = fails[:failing] + [(name, "a test failed")] * (failing - len(fails))
    skips = [(f"{name} {n}", r.strip()) for n, r in UNITTEST_SKIP.findall(out)]
    t.skipped = skips[:skipping] + [(name, "skipped")] * (skipping - len(skips))
    return t


def parse_plain_unittest(name, out):
    """The tests of `python3 -m unittest -v` output, from its closing "Ran N tests" and
    OK or FAILED (...) lines and its "... skipped 'reason'" lines; None without them."""
    m = None
    for m in PLAIN_RAN.finditer(out):
        pass
    if m is None:
        return None
    counts = {}
    for part in (m.group(3) or "").split(","):
        key, _, value = part.strip().partition("=")
        if value.isdigit():
            counts[key] = int(value)
    failing = counts.get("failures", 0) + counts.get("errors", 0)
    failing += counts.get("unexpected successes", 0)
    if m.group(2) == "FAILED":
        failing = max(failing, 1)
    skipping = counts.get("skipped", 0)
    t = Tally()
    t.passed = max(int(m.group(1)) - failing - skipping, 0)
    t.failed = [(name, "a test failed")] * failing
    skips = [(f"{name} {n}", r) for n, _, r in PLAIN_SKIP.findall(out)]
    t.skipped = skips[:skipping] + [(name, "skipped")] * (skipping - len(skips))
    return t


def last_line(text):
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def failure_line(text):
    """What a failed program said: its first line naming a failure or an error, else its last."""
    for ln in text.splitlines():
        if re.search(r"FAIL|[Ee]rror|violation", ln):
            return ln.strip()[:300]
    return last_line(text)[:300]


def parse_testcase(name, status, out, skip_message, failure_message):
    """One ctest entry: its Criterion or unittest tests, else itself as one test."""
    t = Tally()
    if status == "disabled":
        t.skipped.append((name, "disabled in ctest"))
        return t
    if status == "notrun":
        if skip_message.startswith("SKIP_"):  # SKIP_RETURN_CODE=N, SKIP_REGULAR_EXPRESSION_MATCHED
            said = PLAIN_SKIP.search(out)  # a unittest run that skipped says why on its line
            t.skipped.append((name, said.group(3) if said else last_line(out) or skip_message))
        else:  # no executable, a failed fixture: ctest counts these as failures
            t.failed.append((name, f"not run: {skip_message or last_line(out)}"))
        return t
    inner = parse_criterion(name, out) or parse_unittest(name, out) or parse_plain_unittest(name, out)
    if inner is not None:
        t.add(inner)
        if status != "run" and not inner.failed:
            t.failed.append((name, failure_message or failure_line(out) or "failed"))
        return t
    if status == "run":
        t.passed += 1
    else:
        t.failed.append((name, failure_message or failure_line(out) or "failed"))
    return t


def parse_junit(text, prefix=""):
    """Every test of a ctest --output-junit file."""
    t = Tally()
    for case in ET.fromstring(text).iter("testcase"):
        out = case.findtext("system-out") or ""
        skip = case.find("skipped")
        fail = case.find("failure")
        t.add(parse_testcase(prefix + case.get("name", "?"), case.get("status", ""), out,
                             skip.get("message", "") if skip is not None else "",
                             fail.get("message", "") if fail is not None else ""))
    return t


def parse_checks(text):
    """all.sh's checks.txt: NAME ok|FAILED|skipped SECONDS [REASON]."""
    t = Tally()
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 2:
            continue
        name, status = "check " + parts[0], parts[1]
        if status == "ok":
            t.passed += 1
        elif status == "skipped":
            t.skipped.append((name, parts[3] if len(parts) > 3 else "skipped"))
        else:
            t.failed.append((name, f"{status} (tests/check/{parts[0]}.sh)"))
    return t


def report(results_dir):
    t = Tally()
    missing = []
    sources = [("ctest.xml", True, lambda s: parse_junit(s)),
               ("asan-ctest.xml", False, lambda s: parse_junit(s, "asan ")),
               ("checks.txt", True, parse_checks)]
    for fname, required, parse in sources:
        path = os.path.join(results_dir, fname)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                t.add(parse(f.read()))
        except FileNotFoundError:
            if required:
                t.failed.append((fname, f"no {path}: that part did not finish"))
                missing.append(fname)
        except ET.ParseError as e:
            t.failed.append((fname, f"{path} unreadable: {e}"))
    for n, r in t.skipped:
        print(f"skipped: {n}: {r}")
    for n, r in t.failed:
        print(f"FAILED: {n}: {r}")
    print(t.line())
    return 1 if t.failed else 0


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passes = 0

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passes += 1


def run_unittest(test_dir):
    suite = unittest.defaultTestLoader.discover(test_dir, top_level_dir=test_dir)
    result = unittest.TextTestRunner(verbosity=2, resultclass=_Result).run(suite)
    sys.stderr.flush()
    # A test by its id, module.Class.method (a subtest adds its parameters).
    failed = [test.id() for test, _ in result.failures + result.errors]
    failed += [test.id() for test in result.unexpectedSuccesses]
    lines = [f"unittest result: {result.passes + len(result.expectedFailures)} passed, "
             f"{len(failed)} failed, {len(result.skipped)} skipped"]
    # ": " ends the name in a skip line, so a name keeps none.
    lines += [f"unittest skipped: {test.id().replace(': ', ':')}: {' '.join(str(reason).split())}"
              for test, reason in result.skipped]
    lines += [f"unittest failed: {' '.join(name.split())}" for name in failed]
    print("\n".join(lines), flush=True)
    return 0 if result.wasSuccessful() else 1


def main(argv):
    if len(argv) == 3 and argv[1] == "report":
        return report(argv[2])
    if len(argv) == 3 and argv[1] == "unittest":
        return run_unittest(argv[2])
    print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
