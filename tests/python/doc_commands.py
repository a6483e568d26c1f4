"""The shell commands README.md and docs/*.md show, read from the documents themselves.

A command is a line of a code block, or an inline code span, that starts (after any
`NAME=value` settings) with a program a reader types: a path into the build (`build/stowage`),
a script of the repository (`bench/x.py ARGS`, `tests/check/x.sh ARGS`), or one of the tools
in PROGRAMS (`python3`, `bash`, `make`, `cc`...). In a block whose lines start with `$ `,
only those lines are commands (the others are output). Inline spans may wrap onto the next
line of a paragraph, as Markdown allows.

Some spans name a thing rather than run it, and are returned apart as references: a script's
path or a tool's name alone (`bench/scaled_traces.py`, `make`) and a subcommand's name alone
(`build/stowage report`, `stowage diff`, `python -m stowage import pytorch`).

    python3 tests/python/doc_commands.py     # lists every command and reference, by document
"""

import glob
import os
import re
from collections import namedtuple

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

Command = namedtuple("Command", "path line text")  # path relative to ROOT, 1-based line

PROGRAMS = ("python3", "python", "bash", "sh", "make", "pip", "pip3", "cc", "gcc", "clang",
            "cmake", "ctest", "chromium", "stowage", "valgrind", "echo")
SCRIPT = r"(?:bench|tests|python)/[\w./-]+\.(?:py|sh)"
ENV = r"(?:[A-Z_][A-Z0-9_]*=(?:\"[^\"]*\"|'[^']*'|[^\s\"']*)\s+)*"
PROGRAM = (r"(?:build(?:-\w+)?/[\w/-]*\w|\./[\w./-]+|" + SCRIPT + "|"
           + "|".join(re.escape(p) for p in PROGRAMS) + r")(?=\s|$)")
COMMAND = re.compile(ENV + PROGRAM)
# Names, not commands: a script's path or a tool's name alone, a subcommand's name alone.
NAME = re.compile(r"(?:" + SCRIPT + "|" + "|".join(re.escape(p) for p in PROGRAMS) +
                  r"|(?:build/|python3? -m )?stowage(?: [a-z]+)*)$")


def documents():
    """README.md and docs/*.md, relative to ROOT."""
    return ["README.md"] + sorted(os.path.relpath(p, ROOT)
                                  for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def strip_comment(line):
    """A shell line without its trailing `# comment` (a `#` that starts a word, unquoted)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _in_list(lines, blank):
    """Whether the text before the blank line at index blank is a list item (or its
    continuation), which an indented line after it continues."""
    k = blank
    while k > 0 and lines[k].strip() == "":
        k -= 1
    return bool(re.match(r"\s+\S|\s*(?:[-*+]|\d+\.)\s", lines[k]))


def _blocks(lines):
    """([(first line index, [lines])] of the fenced and indented code blocks, the lines with
    every block blanked: the prose, for the inline spans)."""
    prose = list(lines)
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            blocks.append((i + 1, lines[i + 1:j]))
            for k in range(i, min(j + 1, len(lines))):
                prose[k] = ""
            i = j + 1
            continue
        # An indented block: 4 spaces after a blank line, not continuing a list item.
        if lines[i].startswith("    ") and i > 0 and lines[i - 1].strip() == "" and \
                not _in_list(lines, i - 1):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or lines[j].strip() == ""):
                j += 1
            start = i
            while i < j:
                prose[i] = ""
                i += 1
            blocks.append((start, [line[4:] for line in lines[start:j]]))
            continue
        i += 1
    return blocks, prose


def extract(path):
    """(commands, references) of one document."""
    with open(os.path.join(ROOT, path)) as f:
        lines = f.read().split("\n")
    commands, references = [], []
    blocks, prose = _blocks(lines)
    for first, body in blocks:
        prompted = any(line.startswith("$ ") for line in body)
        for k, line in enumerate(body):
            if prompted:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            text = strip_comment(line.strip())
            if COMMAND.match(text):
                commands.append(Command(path, first + k + 1, text))
    # Inline spans: a paragraph's text with line breaks, so a span may wrap once.
    text = "\n".join(prose)
    for m in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)?)`", text):
        span = re.sub(r"\s+", " ", m.group(1).replace("\\|", "|")).strip()
        if not COMMAND.match(span):
            continue
        line = text.count("\n", 0, m.start()) + 1
        (references if NAME.match(span) else commands).append(Command(path, line, span))
    return sorted(commands, key=lambda c: c.line), references


def all_commands():
    """(commands, references) of every document, in document order."""
    commands, references = [], []
    for path in documents():
        c, r = extract(path)
        commands += c
        references += r
    return commands, references


# How the tests run each documented command (tests/python/test_docs.py). A command without a
# rule runs as written and must exit 0. The commands run one after another in a copy of the
# working tree (build/ the build under test, ../shared beside it), in document order, so a
# command can read what an earlier one wrote (OUT, DIR), as a reader following the text would.
#   skip:   why it cannot run in a test run (a GPU, PyTorch, the network, a build, the suite
#           itself); listed as skipped with this reason.
#   long:   why it takes over a minute on 2 cores; skipped unless STOWAGE_DOC_LONG=1.
#   fill:   (placeholder, value) pairs: the command's placeholders and [optional] parts, as
#           the text around it defines them; each placeholder must occur in the command.
#   append: the input a command's sentence names but the span leaves out (a trace).
#   files:  {name: source}: files the command reads that its text made elsewhere (the C
#           example, a snapshot); source is a path in the repository, or "readme-c".
#   before: a shell line run first (the report a screenshot opens).
#   timeout: seconds it may take (default 300).
#   status: the exit status the document shows (default 0).
#   expect: text its standard output must hold (the output the document shows).
#   shared: reads ../shared/traces without naming it (skipped without them).
#   needs:  programs it needs (skipped where absent: make deps installs them).
#   requires: (path, how it is built): a program of another build it runs; skipped where absent.
#   torch:  runs `python` of the recorder's environment (make deps), which imports the pinned
#           torch; skipped where that environment is absent.
#   listed: a ctest test's name: the command would run that test inside this suite's own
#           ctest run, so the test checks that ctest lists it and skips the run.
BUNDLED = "bench/traces/resnet50_train.rep"
SNAPSHOT_GZ = "bench/gpu/results/2026-12-04-h200/run2/unseen/bert_train.pickle.gz"
GPU = "needs an NVIDIA GPU: bench/gpu/run.sh runs on the GPU machine (docs/torch.md, GPU checks)"
SNAPSHOTS = ("DIR holds the public PyTorch snapshots of bench/snapshots.txt, fetched over the "
             "network by bench/fetch_snapshots.py")
BUILDS = "configures and builds a tree (minutes on 2 cores); the tests run from a finished build"
FUZZ_BUILD = "`bash tests/check/fuzz.sh` builds it"
STANDS_IN = {"run.rep": BUNDLED, "before.rep": BUNDLED}

RULES = {
    # README.md
    "pip install --no-build-isolation ./python": dict(
        skip="installs the package into the Python that runs these tests; "
             "ctest's pip_install runs this command in a fresh venv"),
    "cmake -S . -B build && cmake --build build && cmake --install build --prefix PREFIX": dict(
        skip=BUILDS + "; `cmake --install build --prefix P` (docs/torch.md) runs here"),
    "make demo": dict(
        skip="configures and builds build/ with make's flags before its replay (minutes from a "
             "clean clone), which would reconfigure the build these tests run from"),
    "python -m stowage predict --gpu H100 train.py": dict(
        torch=True, fill=[("train.py", "bench/predict/resnet50_train.py")]),
    "make test": dict(skip="the whole suite, about 20 minutes, this test included"),
    "stowage replay --tuning KEY:VALUE,...": dict(
        fill=[("KEY:VALUE,...", "vmm_slack:0,quick_depth:4")], append=BUNDLED),
    "stowage CMD --help": dict(fill=[("CMD", "plan")]),
    "cc example.c -Iinclude -Lbuild -lstowage -Wl,-rpath,$PWD/build && ./a.out": dict(
        files={"example.c": "readme-c"}, expect="Allocated memory"),
    "python -m stowage import pytorch SNAPSHOT -o run.rep": dict(
        fill=[("SNAPSHOT", "snapshot.pickle")], files={"snapshot.pickle": SNAPSHOT_GZ}),
    # docs/benchmarks.md
    "make build": dict(skip=BUILDS),
    "python3 bench/pool_goals.py --snapshots DIR --details": dict(
        skip=SNAPSHOTS + "; about 40 minutes on 2 cores"),
    "build/planned_steps": dict(append=BUNDLED),
    "TABLE=1 bench/vmm_handles.sh DIR": dict(skip=SNAPSHOTS),
    "python3 bench/snapshot_check.py DIR/*": dict(skip=SNAPSHOTS),
    "bench/snapshot_check.py --workloads": dict(skip=SNAPSHOTS),
    "bench/snapshot_heldout.sh DIR": dict(skip=SNAPSHOTS),
    "python3 bench/pool_goals.py --snapshots DIR --details": dict(skip=SNAPSHOTS),
    "build/vmm_churn --replays 1 --parts 8": dict(append=BUNDLED),
    "bench/snapshot_check.py DIR/* --workloads OUT --iterations 64": dict(skip=SNAPSHOTS),
    "SET=zoo bench/vmm_long_run.sh": dict(
        long="extends the corpus's 261 training runs by 40 steps and replays each under both "
             "pools three times: about 2.5 minutes on 2 cores", timeout=900),
    'POLICIES="classic vmm jemalloc" bench/warm_instructions.sh ../shared/traces/*.rep': dict(
        long="callgrind over every shared trace under three policies: 130 s on 2 cores",
        needs=["valgrind"]),
    "bench/replay_all.sh 11 7": dict(
        long="times every policy on every shared trace in 11 rounds: 90 s on 2 cores"),
    'PARTS="1 9" bash bench/gpu/run.sh': dict(skip=GPU),
    "bench/ab_builds.sh DIR_A DIR_B TRACE [ROUNDS] [REPEATS]": dict(
        fill=[("DIR_A", "build"), ("DIR_B", "build"), ("TRACE", BUNDLED), ("[ROUNDS]", "2"),
              ("[REPEATS]", "1")]),
    "bench/cost_ceiling.sh ROUNDS REPEATS [--breakdown]": dict(
        skip="builds two to six patched copies of the tree (minutes) before its timed rounds"),
    # docs/decisions.md
    "stowage replay --tuning name:value": dict(fill=[("name:value", "vmm_slack:0")],
                                               append=BUNDLED),
    "build/vmm_churn": dict(append=BUNDLED),
    "python3 bench/pool_goals.py --snapshots DIR --sets shared,scaled,mixes,streams,snapshots,"
    "long,varlen,buckets,random --policies vmm,classic --tuning "
    "vmm_learn_step:false,planned_auto:true": dict(
        skip=SNAPSHOTS + "; about 40 minutes on 2 cores"),
    "python3 bench/pool_goals.py --sets zoo --policies vmm --tuning vmm_handle_mb:N --details":
        dict(fill=[("vmm_handle_mb:N", "vmm_handle_mb:2")],
             long="replays the corpus's 565 workloads under the page-mapped pool and both "
                  "PyTorch models: about 3 minutes on 2 cores", timeout=1800),
    "stowage replay --policy vmm --summary TRACE": dict(fill=[("TRACE", BUNDLED)]),
    "python3 bench/pool_goals.py --sets zoo --policies vmm --tuning vmm_slack:0.05,"
    "vmm_slack_max:0.05 --details": dict(
        long="replays the corpus's 565 workloads under the page-mapped pool and both "
             "PyTorch models: about 3 minutes on 2 cores", timeout=1800),
    "python3 bench/pool_goals.py --sets zoo --policies classic --details": dict(
        long="replays the corpus's 565 workloads under the classic pool and both PyTorch "
             "models: about 3 minutes on 2 cores", timeout=1800),
    "python3 bench/pool_goals.py --snapshots DIR --policies classic --details": dict(
        skip=SNAPSHOTS + "; about 15 minutes on 2 cores"),
    "python3 bench/pool_goals.py --sets long,varlen,buckets,random": dict(
        long="replays 33 loops under both pools, the PyTorch models and build/planned_steps: "
             "about 10 minutes on 2 cores", shared=True),
    "build/stowage replay --policy classic --policy vmm --policy pytorch --policy "
    "pytorch-expandable --json": dict(append=BUNDLED),
    "bench/snapshot_check.py SNAPSHOTS/* --workloads DIR --iterations 64": dict(skip=SNAPSHOTS),
    "POLICIES=classic bench/warm_instructions.sh ../shared/traces/gpt2_train.rep": dict(
        needs=["valgrind"]),
    "POLICIES=classic bench/warm_instructions.sh [--tuning ...] ../shared/traces/*.rep": dict(
        fill=[("[--tuning ...]", "--tuning quick_depth:4")], needs=["valgrind"]),
    "build/vmm_churn --replays 8 [--conf ...]": dict(
        fill=[("[--conf ...]", "--conf quick_depth:4")], append="../shared/traces/*.rep"),
    "bench/scaled_traces.py DIR --factors 0.6,0.62,0.65,0.68,0.7,0.75,0.77,0.8,0.83,0.85,0.9,"
    "0.93,0.95,1.03,1.05,1.07,1.1,1.13,1.15,1.22,1.25,1.33,1.35,1.45,1.5,1.6,1.62,1.75": dict(
        shared=True),
    "bench/loop_calls.py --loop DIR64 DIR3": dict(skip=SNAPSHOTS),
    "build/vmm_churn --replays 1 --parts 40": dict(append=BUNDLED),
    "POLICIES=vmm bench/warm_instructions.sh": dict(
        append="../shared/traces/gpt2_generate.rep", needs=["valgrind"]),
    "stowage replay --policy vmm --json [--tuning vmm_learn_step:false]": dict(
        fill=[("[--tuning vmm_learn_step:false]", "--tuning vmm_learn_step:false")],
        append=BUNDLED),
    "POLICIES=vmm bench/warm_instructions.sh [--tuning vmm_learn_step:false] TRACE": dict(
        fill=[("[--tuning vmm_learn_step:false]", "--tuning vmm_learn_step:false"),
              ("TRACE", BUNDLED)], needs=["valgrind"]),
    "bench/vmm_handles.sh DIR": dict(skip=SNAPSHOTS),
    "build/stowage replay --policy vmm --policy pytorch --policy pytorch-expandable "
    "--policy ideal-remap --repeats 1 --json TRACE": dict(fill=[("TRACE", BUNDLED)]),
    "build/planned_steps --conf policy:vmm,planned_steps:true": dict(append=BUNDLED),
    "build/planned_steps --parts 42 --conf C OUT/*.rep": dict(
        fill=[("--conf C", "--conf policy:vmm,planned_auto:true")], shared=True),
    "build/planned_steps --conf policy:P,planned_steps:true": dict(
        fill=[("policy:P", "policy:vmm")], append=BUNDLED),
    # docs/planned.md
    "stowage replay --conf planned_steps:true": dict(append=BUNDLED),
    "stowage replay --tuning planned_auto:true": dict(append=BUNDLED),
    "build/planned_steps --conf policy:P,planned_steps:true OUT/*.rep": dict(
        fill=[("policy:P", "policy:classic")], shared=True),
    "python3 bench/changed_steps.py IN OUT --rate R": dict(
        fill=[("IN OUT", "OUT/gpt2_train_long.rep OUT/gpt2_train_changed.rep"),
              ("--rate R", "--rate 0.002")], shared=True),
    "build/planned_steps --conf policy:P,planned_steps:B": dict(
        fill=[("policy:P", "policy:vmm"), ("planned_steps:B", "planned_steps:true")],
        append="OUT/gpt2_train_changed.rep", shared=True),
    'POLICIES="classic classic-planned vmm vmm-planned" bash bench/warm_instructions.sh '
    'OUT/*_long.rep': dict(
        long="callgrind over three long runs under four policies: minutes on 2 cores",
        needs=["valgrind"], shared=True),
    # docs/planner.md
    "build/stowage plan [--capacity BYTES] [--time-limit SECONDS] [--seed N] [--json] "
    "[-o OUT.csv] FILE": dict(
        fill=[("[--capacity BYTES]", "--capacity 1M"), ("[--time-limit SECONDS]", "--time-limit 2"),
              ("[--seed N]", "--seed 7"), ("[--json]", "--json"), ("[-o OUT.csv]", "-o OUT.csv"),
              ("FILE", "tests/fuzz/corpus/plan_csv/minimalloc_example.csv")]),
    "build/stowage plan [options] --from-trace TRACE.rep": dict(
        fill=[("[options]", "--time-limit 2"), ("TRACE.rep", BUNDLED)]),
    "build/stowage peak [--alpha A] [--capacity BYTES] [--json] FILE": dict(
        fill=[("[--alpha A]", "--alpha 0.5"), ("[--capacity BYTES]", "--capacity 100"),
              ("[--json]", "--json"), ("FILE", "tests/data/schedule_example.txt")],
        expect='"peak_bytes":22,'),
    "build/stowage peak tests/data/schedule_example.txt": dict(
        expect="peak: 22 bytes inside op o3"),
    "cmake -S . -B /tmp/planb -DCMAKE_BUILD_TYPE=Release -DSTOW_WERROR=ON": dict(
        skip="the first step of the planner benchmark's build: " + BUILDS),
    "cmake --build /tmp/planb -j2 --target stowage_cli test_plan": dict(skip=BUILDS),
    "bench/plan_bench.sh /tmp/planb/stowage ../shared/data 10 ../shared/traces": dict(
        long="plans 21 files with a 10 s limit each",
        requires=("/tmp/planb/stowage", "the two commands above build it")),
    "build/stowage plan --time-limit 60 -o D.plan.csv ../shared/data/minimalloc/D.1048576.csv":
        dict(long="its search runs its whole 60 s limit"),
    "build/stowage plan --time-limit 60 -o J.plan.csv ../shared/data/minimalloc/J.1048576.csv":
        dict(long="its search runs its whole 60 s limit"),
    # docs/pytorch_model.md
    "stowage replay --policy pytorch|pytorch-expandable": dict(
        fill=[("pytorch|pytorch-expandable", "pytorch --policy pytorch-expandable")],
        append=BUNDLED),
    "python3 bench/fetch_snapshots.py snapshots/": dict(
        skip="downloads the public snapshots of bench/snapshots.txt (the network)"),
    "python3 bench/snapshot_check.py snapshots/*": dict(skip=SNAPSHOTS.replace("DIR", "snapshots/")),
    # docs/reliability.md
    "python3 -m unittest -v": dict(
        skip="names how a ctest entry runs its Python tests, in that entry's directory; from "
             "the repository root it finds no test"),
    "bash tests/check/fuzz.sh": dict(
        skip="builds every fuzzer with clang's libFuzzer and runs each 20 s (minutes)"),
    "build/stress_threads [threads [ops [seed [classic|vmm [sim|cuda]]]]]": dict(
        fill=[("[threads [ops [seed [classic|vmm [sim|cuda]]]]]", "4 20000 7 vmm sim")]),
    "build/stress_integrity --seconds 60 policy:vmm": dict(long="runs for its 60 s"),
    "bash tests/check/integrity.sh long": dict(long="600 s a pool", timeout=900),
    "build/lock_exclusion [threads [rounds]]": dict(
        fill=[("[threads [rounds]]", "4 50000")]),
    "bash tests/check/asan.sh": dict(
        skip="builds the tree with ASan and UBSan and runs the whole suite there (many minutes)"),
    "bash tests/check/valgrind.sh": dict(
        long="memcheck over seven unit test programs and a stress run: minutes",
        needs=["valgrind"], timeout=1200),
    "FUZZ_API_VERBOSE=1 build-fuzz/fuzz_api FILE": dict(
        fill=[("FILE", "tests/fuzz/corpus/api/regress-vmm-single-stream-unmap-under-work")],
        requires=("build-fuzz/fuzz_api", FUZZ_BUILD)),
    "FUZZ_STEP_VERBOSE=1 build-fuzz/fuzz_step FILE": dict(
        fill=[("FILE", "tests/fuzz/corpus/step/0007f4162d2da2fbb0dae00d34439ba75394c34c")],
        requires=("build-fuzz/fuzz_step", FUZZ_BUILD)),
    "CC=clang cmake -S . -B build-fuzz-fast -DSTOW_FUZZ=ON -DSTOW_FUZZ_SANITIZERS=undefined "
    "-DSTOW_BUILD_TESTS=OFF -DSTOW_DEBUG=1": dict(needs=["clang"]),
    "bash tests/check/integrity.sh long 600": dict(long="600 s a pool", timeout=900),
    "bash tests/check/integrity.sh sabotage": dict(
        skip="copies the tree and builds the stress six times, once per deliberate bug "
             "(minutes)"),
    # docs/report.md
    "stowage report --growth": dict(append="tests/data/report_leak.rep", status=1),
    "build/stowage report tests/data/report_leak.rep --growth": dict(
        status=1, expect="warning: live bytes grow at every iteration boundary (2097152 bytes "
                         "per iteration): a leak?"),
    "echo $?": dict(skip="shows the status of the command above it, which the test checks there"),
    "build/stowage diff ../shared/traces/resnet50_train.rep "
    "../shared/traces/resnet_multiscale_train.rep": dict(
        expect="ok: peak live -7.00%, peak reserved "),
    "stowage diff baseline.rep new.rep": dict(
        files={"baseline.rep": BUNDLED, "new.rep": BUNDLED}),
    "python3 python/stowage/snapshot_import.py snapshot.pickle -o run.rep [--device N]": dict(
        fill=[("[--device N]", "--device 0")], files={"snapshot.pickle": SNAPSHOT_GZ}),
    "python3 -m unittest discover -s tests/python": dict(
        skip="runs this suite, this test included (ctest's python_tests runs it)"),
    "bench/snapshot_tags.py DIR": dict(skip=SNAPSHOTS),
    "python3 bench/snapshot_tags.py DIR --frames": dict(skip=SNAPSHOTS),
    "build/stowage import rmm rmm_log.csv -o run.rep": dict(
        files={"rmm_log.csv": "tests/data/report_rmm.csv"}),
    "tests/check/report_browser.sh [BUILD_DIR] [TRACE...]": dict(
        fill=[("[BUILD_DIR] [TRACE...]", "build " + BUNDLED)], needs=["chromium"]),
    "make deps": dict(skip="installs Debian packages as root (apt-get, the network)"),
    "chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --screenshot=out.png "
    "--window-size=1360,1000 file:///path/report.html": dict(
        fill=[("file:///path/report.html", "file://$PWD/report.html")],
        before="build/stowage report " + BUNDLED + " -o report.html", needs=["chromium"]),
    # docs/torch.md
    'python -c "import stowage; print(stowage.library_path())"': dict(expect="libstowage.so"),
    "python -m stowage replay trace.rep": dict(files={"trace.rep": BUNDLED}),
    "ctest --test-dir build -R pip_install": dict(listed="pip_install"),
    "cmake --install build --prefix P": dict(fill=[("--prefix P", "--prefix prefix")]),
    "ctest --test-dir build -R install_consumer": dict(listed="install_consumer"),
    "python -m torch.cuda._memory_viz stats stowage.pickle": dict(
        skip="needs PyTorch and the snapshot the block above dumps under PyTorch on a GPU"),
    "stowage report run.rep -o report.html": dict(files=STANDS_IN),
    "stowage replay --policy all run.rep": dict(files=STANDS_IN),
    "stowage diff before.rep run.rep": dict(files=STANDS_IN),
    "bash bench/gpu/prepare.sh": dict(
        skip="builds the GPU tests and a profiling CLI (build-gpu-tests/, build-gpu-prof/: "
             "minutes) for a GPU run"),
    "python3 bench/model_check.py bench/gpu/results/2026-12-04-h200/run2/unseen": dict(
        expect="8 comparisons on 4 workloads, worst 0.000%, 0 beyond 1%"),
    'PARTS="1 8" bash bench/gpu/run.sh': dict(skip=GPU),
    'PARTS="1 5" TRAIN_STEPS=60 TRAIN_MODELS=resnet50 TRAIN_MODES="native stowage_classic" '
    'TRAIN_ROUNDS=2 bash bench/gpu/run.sh': dict(skip=GPU),
    # docs/predict.md
    "python -m stowage predict bench/predict/vit_train.py": dict(torch=True),
    "python -m stowage predict --json --gpu H200 bench/predict/gpt2_train.py": dict(
        torch=True, expect='"peak_allocated_bytes": 13594220032'),
    "python -m stowage predict --gpu A100-40GB --capacity 40GiB --alpha 0.2 "
    "bench/predict/resnet50_train.py": dict(torch=True),
    "python -m stowage predict --sweep BATCH=64,128,256,512 --capacity 80GiB "
    "bench/predict/vit_train.py": dict(
        torch=True, long="records the script four times: about 80 s on 2 cores"),
    "python -m stowage predict -o vit.rep bench/predict/vit_train.py": dict(torch=True),
    "stowage report vit.rep": dict(torch=True),
    "python -m stowage predict bench/predict/gpt2_train.py": dict(
        torch=True, expect="events 12355, peak allocated 12.66 GiB (13594220032 B)"),
    "stowage replay --min-capacity": dict(append=BUNDLED),
    "python bench/predict_check.py --gpu H200 --compare": dict(
        torch=True, long="records the five workloads and replays each: about 2 minutes",
        shared=True),
    # docs/trace_format.md
    "bench/long_run.py --markers KEY": dict(
        fill=[("KEY", "train")], append="OUT " + BUNDLED),
}



if __name__ == "__main__":
    cmds, refs = all_commands()
    for c in cmds:
        print(f"{c.path}:{c.line}: {c.text}")
    print(f"{len(cmds)} commands; references:")
    for r in refs:
        print(f"{r.path}:{r.line}: {r.text}")
