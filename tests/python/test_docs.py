"""The documentation against the code: README's C example, its configuration table, the
replay tables of README.md and docs/benchmarks.md, every shell command README.md and docs/*.md
show, and the history check.

Run from the repository root after building:
    python3 -m unittest tests/python/test_docs.py -v
STOWAGE_LIB names the built library (default build/libstowage.so); the CLI is looked for
beside it. The replay tables need ../shared/traces and are skipped without them.

The documented commands (tests/python/doc_commands.py finds them, and says how each runs) run
as written, one after another, in a copy of the working tree whose build/ is the build under
test and whose ../shared is the repository's. Each is a subtest: a command that cannot run
here is listed as skipped with its reason. STOWAGE_DOC_LONG=1 also runs those that take over
a minute (several minutes in all).
"""

import glob
import gzip
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import doc_commands  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
LIB = os.environ.get("STOWAGE_LIB") or os.path.join(ROOT, "build", "libstowage.so")
BUILD = os.path.dirname(os.path.abspath(LIB))
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))
COMMAND_TIMEOUT_S = 300  # a rule's timeout replaces it


def torch_python():
    """The python of the recorder's environment (make deps: STOWAGE_VENV, else
    ~/.cache/stowage/venv), or None where it is absent or cannot import torch."""
    venv = os.environ.get("STOWAGE_VENV") or os.path.expanduser("~/.cache/stowage/venv")
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        return None
    r = subprocess.run([py, "-c", "import torch"], capture_output=True)
    return py if r.returncode == 0 else None


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


def options_keys(function):
    """The keys one function of allocator/options.c compares against: apply_key, the
    settings of stow_config_parse; apply_tuning_key, the measured constants."""
    with open(os.path.join(ROOT, "allocator", "options.c")) as f:
        source = f.read()
    body = re.search(r"\n(?:static )?stow_status_t " + function + r"\(.*?\n}\n", source, re.S)
    if not body:
        raise AssertionError(f"allocator/options.c has no {function}")
    return set(re.findall(r'!strcmp\(key, "([a-z0-9_]+)"\)', body.group(0)))


class ReadmeConfiguration(unittest.TestCase):
    def table_rows(self):
        section = readme().split("## Configuration", 1)[1].split("\n## ", 1)[0]
        return "\n".join(line for line in section.splitlines() if line.startswith("|"))

    def test_the_table_lists_every_key_the_parser_accepts(self):
        keys = options_keys("apply_key")
        self.assertIn("policy", keys)
        rows = self.table_rows()
        missing = sorted(k for k in keys if f"`{k}`" not in rows)
        self.assertEqual(missing, [], "README.md's configuration table lacks these keys")

    def test_the_table_lists_no_measured_constant_as_a_setting(self):
        constants = options_keys("apply_tuning_key")
        self.assertIn("vmm_slack", constants)
        self.assertNotIn("policy", constants)
        rows = self.table_rows()
        listed = sorted(k for k in constants if re.search(r"^\| `" + k + "` ", rows, re.M))
        self.assertEqual(listed, [], "README.md's configuration table lists these constants "
                                     "(stowage/tuning.h) as keys of STOWAGE_CONF")


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


class DocTablesFiles(unittest.TestCase):
    """bench/doc_tables.py reads every document before any replay, so these need no traces."""

    def run_tables(self, *args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "doc_tables.py")] +
                              list(args), capture_output=True, text=True, cwd=ROOT)

    def test_check_and_write_need_a_document(self):
        for mode in ("--check", "--write"):
            r = self.run_tables(mode)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("need the documents", r.stderr)

    def test_a_missing_document_is_named(self):
        r = self.run_tables("--check", "README.md", "docs/no_such_file.md")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stderr.strip(),
                         "doc_tables: docs/no_such_file.md: No such file or directory")

    def test_a_document_without_a_marker_is_an_error(self):
        r = self.run_tables("--check", "docs/design.md")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("docs/design.md: no table marker", r.stderr)

    def test_an_unknown_table_is_named_with_its_line(self):
        with tempfile.TemporaryDirectory() as d:
            doc = os.path.join(d, "doc.md")
            with open(doc, "w") as f:
                f.write("text\n<!-- doc_tables:nosuch -->\n| a |\n")
            r = self.run_tables("--write", doc)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertEqual(r.stderr.strip(), f"doc_tables: {doc}:2: unknown table 'nosuch'")
            with open(doc) as f:
                self.assertEqual(f.read(), "text\n<!-- doc_tables:nosuch -->\n| a |\n")


def working_copy(dest):
    """A copy of the working tree (what git tracks or would track) at dest/repo, with build/
    the build under test and dest/shared the repository's ../shared; returns dest/repo."""
    repo = os.path.join(dest, "repo")
    r = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True)
    if r.returncode == 0:
        files = [f for f in r.stdout.decode().split("\0") if f]
    else:  # not a git checkout: every file but builds and caches
        files = []
        for d, dirs, names in os.walk(ROOT):
            dirs[:] = [x for x in dirs if not x.startswith(("build", ".git", "__pycache__"))]
            files += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
    for f in files:
        src = os.path.join(ROOT, f)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        os.makedirs(os.path.dirname(os.path.join(repo, f)), exist_ok=True)
        shutil.copy2(src, os.path.join(repo, f))
    os.symlink(BUILD, os.path.join(repo, "build"))
    if os.path.isdir(os.path.join(ROOT, "build-fuzz")):
        os.symlink(os.path.join(ROOT, "build-fuzz"), os.path.join(repo, "build-fuzz"))
    if os.path.isdir(SHARED):
        os.symlink(SHARED, os.path.join(dest, "shared"))
    return repo


def run_bounded(command, cwd, env, timeout):
    """`bash -c command`'s completed process, or None when it ran past timeout seconds: then
    its whole process group (a browser, a valgrind child) is stopped."""
    p = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def readme_c_example():
    blocks = re.findall(r"```c\n(.*?)```", readme(), re.S)
    return blocks[0]


def command_program(text):
    """The program a command line starts with, after its NAME=value settings."""
    words = shlex.split(text.split("&&")[0])
    while words and re.match(r"[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)
    return words[0] if words else ""


class DocumentedCommands(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.commands, cls.references = doc_commands.all_commands()

    def test_the_documents_show_commands(self):
        self.assertGreater(len(self.commands), 100)
        texts = {c.text for c in self.commands}
        for text in ("bench/doc_tables.py --check README.md", "make demo",
                     "build/stowage peak tests/data/schedule_example.txt"):
            self.assertIn(text, texts)

    def test_every_rule_is_for_a_documented_command(self):
        texts = {c.text for c in self.commands}
        stale = sorted(k for k in doc_commands.RULES if k not in texts)
        self.assertEqual(stale, [], "rules in tests/python/doc_commands.py for commands no "
                                    "document shows")
        for text, rule in doc_commands.RULES.items():
            for old, _ in rule.get("fill", []):
                self.assertIn(old, text, f"{text}: no '{old}' to fill")

    def test_every_named_script_and_subcommand_exists(self):
        bad = []
        for c in self.references:
            name = re.sub(r"^(build/|python3? -m )", "", c.text)
            if re.fullmatch(doc_commands.SCRIPT, name):
                if not os.path.isfile(os.path.join(ROOT, name)):
                    bad.append(f"{c.path}:{c.line}: {name}: no such file")
            elif name.startswith("stowage ") and os.path.exists(os.path.join(BUILD, "stowage")):
                sub = name.split()[1]
                r = subprocess.run([os.path.join(BUILD, "stowage"), sub, "--help"],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    bad.append(f"{c.path}:{c.line}: {name}: `stowage {sub} --help` exits "
                               f"{r.returncode}")
        self.assertEqual(bad, [])

    def test_every_script_a_command_runs_is_executable(self):
        bad = []
        for c in self.commands:
            program = command_program(c.text)
            if not re.fullmatch(doc_commands.SCRIPT, program):
                continue
            path = os.path.join(ROOT, program)
            where = f"{c.path}:{c.line}: {program}"
            if not os.path.isfile(path):
                bad.append(f"{where}: no such file")
                continue
            with open(path, "rb") as f:
                if not f.readline().startswith(b"#!"):
                    bad.append(f"{where}: no #! line")
            if not os.access(path, os.X_OK):
                bad.append(f"{where}: not executable (chmod +x; git update-index --chmod=+x)")
        self.assertEqual(bad, [])

    def test_every_documented_command_runs(self):
        if not os.path.exists(os.path.join(BUILD, "stowage")):
            self.skipTest(f"{BUILD}/stowage is not built")
        places = {}
        for c in self.commands:
            places.setdefault(c.text, []).append(f"{c.path}:{c.line}")
        with tempfile.TemporaryDirectory() as d:
            repo = working_copy(d)
            shims = os.path.join(d, "bin")
            os.mkdir(shims)
            for name in ("python", "python3"):
                os.symlink(sys.executable, os.path.join(shims, name))
            os.symlink(os.path.join(repo, "build", "stowage"), os.path.join(shims, "stowage"))
            env = dict(os.environ)
            env.pop("STOWAGE_CONF", None)
            env["PATH"] = shims + os.pathsep + env.get("PATH", "")
            # As after `pip install ./python`: the checkout's package, which finds build/.
            env["PYTHONPATH"] = os.path.join(repo, "python")
            for text, where in places.items():
                with self.subTest(command=text, shown=", ".join(where)):
                    self.run_documented(text, doc_commands.RULES.get(text, {}), repo, env)

    def run_documented(self, text, rule, repo, env):
        if "skip" in rule:
            self.skipTest(rule["skip"])
        if "long" in rule and not os.environ.get("STOWAGE_DOC_LONG"):
            self.skipTest(f"long: {rule['long']} (STOWAGE_DOC_LONG=1 runs it)")
        if rule.get("torch"):
            py = torch_python()
            if not py:
                self.skipTest("needs PyTorch: the environment `make deps` makes "
                              "(~/.cache/stowage/venv) is absent or cannot import torch")
            env = dict(env, PATH=os.path.dirname(py) + os.pathsep + env["PATH"])
        for program in [command_program(text)] + rule.get("needs", []):
            if "/" not in program and not shutil.which(program, path=env["PATH"]):
                self.skipTest(f"needs {program} (make deps installs it)")
        if "requires" in rule:
            path, builder = rule["requires"]
            if not os.path.exists(os.path.join(repo, path)):
                self.skipTest(f"needs {path}; {builder}")
        if "listed" in rule:
            r = subprocess.run(["ctest", "--test-dir", BUILD, "-N", "-R", rule["listed"]],
                               capture_output=True, text=True)
            self.assertIn("Total Tests: 1\n", r.stdout, r.stdout + r.stderr)
            self.skipTest(f"runs ctest's {rule['listed']}, which ctest runs beside this suite "
                          "(listed here with -N)")
        run = text
        for old, new in rule.get("fill", []):
            run = run.replace(old, new)
        if rule.get("append"):
            run += " " + rule["append"]
        needed = re.findall(r"\.\./shared/(\S+)", run)
        if rule.get("shared"):
            needed.append("traces/*.rep")
        for path in needed:
            if not glob.glob(os.path.join(SHARED, path)):
                self.skipTest(f"needs ../shared/{path}, absent beside this checkout")
        for name, source in rule.get("files", {}).items():
            dst = os.path.join(repo, name)
            if source == "readme-c":
                with open(dst, "w") as f:
                    f.write(readme_c_example())
            elif source.endswith(".gz"):
                with gzip.open(os.path.join(repo, source), "rb") as g, open(dst, "wb") as f:
                    shutil.copyfileobj(g, f)
            else:
                shutil.copy(os.path.join(repo, source), dst)
        if rule.get("before"):
            r = subprocess.run(["bash", "-c", rule["before"]], cwd=repo, env=env,
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, rule["before"] + "\n" + r.stderr)
        timeout = rule.get("timeout", COMMAND_TIMEOUT_S)
        r = run_bounded(run, repo, env, timeout)
        if r is None:
            self.fail(f"{run}: still running after {timeout} s (stopped)")
        if r.returncode == 77 and "doc_tables.py" in run:
            self.skipTest(r.stdout.strip())
        self.assertEqual(r.returncode, rule.get("status", 0),
                         f"{run}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}")
        if "expect" in rule:
            self.assertIn(rule["expect"], r.stdout, run)


class History(unittest.TestCase):
    def test_no_history_in_the_project_text(self):
        r = subprocess.run(["bash", os.path.join(ROOT, "tests", "check", "history.sh"), ROOT],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr)


if __name__ == "__main__":
    unittest.main()
