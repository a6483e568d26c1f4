"""The documentation against the code: README's C example, its configuration table, the
replay tables of README.md and docs/benchmarks.md, and the history check.

Run from the repository root after building:
    python3 -m unittest tests/python/test_docs.py -v
STOWAGE_LIB names the built library (default build/libstowage.so); the CLI is looked for
beside it. The replay tables need ../shared/traces and are skipped without them.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LIB = os.environ.get("STOWAGE_LIB") or os.path.join(ROOT, "build", "libstowage.so")
BUILD = os.path.dirname(os.path.abspath(LIB))


def readme():
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


class ReadmeExample(unittest.TestCase):
    def test_the_c_example_compiles_and_runs(self):
        blocks = re.findall(r"```c\n(.*?)```", readme(), re.S)
        self.assertEqual(len(blocks), 1, "README.md should hold one C example")
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler")
        if not os.path.exists(LIB):
            self.skipTest(f"{LIB} is not built")
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "example.c"), os.path.join(d, "example")
            with open(src, "w") as f:
                f.write(blocks[0])
            r = subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", src,
                                "-I" + os.path.join(ROOT, "include"), "-L" + BUILD, "-lstowage",
                                "-o", exe], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            env = dict(os.environ, LD_LIBRARY_PATH=BUILD)
            env.pop("STOWAGE_CONF", None)
            r = subprocess.run([exe], capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("Allocated memory", r.stdout)


class ReadmeConfiguration(unittest.TestCase):
    def test_the_table_lists_every_key_the_parser_accepts(self):
        with open(os.path.join(ROOT, "allocator", "options.c")) as f:
            keys = set(re.findall(r'!strcmp\(key, "([a-z0-9_]+)"\)', f.read()))
        self.assertIn("policy", keys)
        section = readme().split("## Configuration", 1)[1].split("\n## ", 1)[0]
        rows = "\n".join(line for line in section.splitlines() if line.startswith("|"))
        missing = sorted(k for k in keys if f"`{k}`" not in rows)
        self.assertEqual(missing, [], "README.md's configuration table lacks these keys")


class ReplayTables(unittest.TestCase):
    def test_readme_and_benchmarks_tables_match_the_replays(self):
        stowage = os.path.join(BUILD, "stowage")
        if not os.path.exists(stowage):
            self.skipTest(f"{stowage} is not built")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "doc_tables.py"),
                            "--check", "--stowage", stowage,
                            os.path.join(ROOT, "README.md"),
                            os.path.join(ROOT, "docs", "benchmarks.md")],
                           capture_output=True, text=True)
        if r.returncode == 77:
            self.skipTest(r.stdout.strip())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


class History(unittest.TestCase):
    def test_no_history_in_the_project_text(self):
        r = subprocess.run(["bash", os.path.join(ROOT, "tests", "check", "history.sh"), ROOT],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr)


if __name__ == "__main__":
    unittest.main()
