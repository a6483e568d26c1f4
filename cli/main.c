/*
 * cli/main.c: build/stowage, the command-line tool. Dispatches to one
 * subcommand per file (cli/cli.h).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "stowage.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: stowage <command> [options]\n"
            "\n"
            "commands:\n"
            "  replay   replay allocation traces on the simulated device under a policy\n"
            "  plan     plan offsets for buffers with known lifetimes (CSV)\n"
            "  peak     exact peak memory of an op schedule\n"
            "  report   memory report of a trace (HTML page, growth, JSON)\n"
            "  diff     compare the memory of two traces; exit 1 on regression\n"
            "  import   convert an RMM log (CSV) to a .rep trace\n"
            "  predict  a PyTorch script's memory on an emulated GPU (the Python package's:\n"
            "           python3 -m stowage predict, docs/predict.md)\n"
            "  version  print the library version\n"
            "\n"
            "'stowage <command> --help' describes each command; '-' as an output file is\n"
            "standard output.\n"
            "Exit status: 0 ok, 1 the command's answer is no (see its --help), 2 bad usage\n"
            "or input.\n");
}

int stow__cli_usage_error(const char *cmd, const char *fmt, ...)
{
    const char *sp = cmd && *cmd ? " " : "";
    fprintf(stderr, "stowage%s%s: ", sp, cmd ? cmd : "");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nsee 'stowage%s%s --help'\n", sp, cmd ? cmd : "");
    return 2;
}

int stow__cli_is_stdout(const char *path) { return path && !strcmp(path, "-"); }

FILE *stow__cli_open_out(const char *path, const char *mode)
{
    if (stow__cli_is_stdout(path))
        return stdout;
    return fopen(path, mode);
}

const char *stow__cli_tags_beside(const char *trace_path, char *buf, size_t len)
{
    size_t n = strlen(trace_path);
    int stem = n > 3 && !strcmp(trace_path + n - 3, ".gz") ? (int)(n - 3) : -1;
    for (int k = 0; k < (stem >= 0 ? 4 : 2); k++) {
        int w = k < 2 ? snprintf(buf, len, "%s.tags%s", trace_path, k ? ".gz" : "")
                      : snprintf(buf, len, "%.*s.tags%s", stem, trace_path, k == 2 ? ".gz" : "");
        if (w >= 0 && (size_t)w < len && access(buf, R_OK) == 0)
            return buf;
    }
    return NULL;
}

int stow__cli_close_out(FILE *f)
{
    if (f == stdout) {
        int bad = fflush(stdout) != 0 || ferror(stdout);
        return bad ? -1 : 0;
    }
    int bad = ferror(f) != 0;
    return fclose(f) != 0 || bad ? -1 : 0;
}

/* `stowage predict` runs PyTorch, so it is the Python package's (docs/predict.md):
 * the tool hands it to `python3 -m stowage predict` (STOWAGE_PYTHON names another
 * interpreter), with the package of the checkout it was built from first on
 * PYTHONPATH where that checkout is still there. Returns only on failure. */
static int hand_predict_to_python(int argc, char **argv)
{
#ifdef STOW_PYTHON_DIR
    if (access(STOW_PYTHON_DIR "/stowage/predict.py", R_OK) == 0) {
        const char *old = getenv("PYTHONPATH");
        size_t n = strlen(STOW_PYTHON_DIR) + (old ? strlen(old) + 1 : 0) + 1;
        char *path = malloc(n);
        if (!path)
            return 2;
        snprintf(path, n, "%s%s%s", STOW_PYTHON_DIR, old ? ":" : "", old ? old : "");
        setenv("PYTHONPATH", path, 1);
        free(path);
    }
#endif
    const char *python = getenv("STOWAGE_PYTHON");
    if (!python || !*python)
        python = "python3";
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args)
        return 2;
    args[0] = (char *)python;
    args[1] = "-m";
    args[2] = "stowage";
    for (int i = 1; i < argc; i++) /* argv[1] is "predict" */
        args[i + 2] = argv[i];
    execvp(python, args);
    fprintf(stderr, "stowage predict: cannot run %s (%s): predict is the Python package's "
                    "command, python3 -m stowage predict (docs/predict.md)\n",
            python, strerror(errno));
    free(args);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return stow__cli_usage_error(
            NULL, "no command given (replay, plan, peak, report, diff, import, predict or version)");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "replay"))
        return stow__cli_replay(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan"))
        return stow__cli_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "peak"))
        return stow__cli_peak(argc - 1, argv + 1);
    if (!strcmp(cmd, "report"))
        return stow__cli_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "diff"))
        return stow__cli_diff(argc - 1, argv + 1);
    if (!strcmp(cmd, "import"))
        return stow__cli_import(argc - 1, argv + 1);
    if (!strcmp(cmd, "predict"))
        return hand_predict_to_python(argc, argv);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        unsigned v = stow_version();
        printf("stowage %u.%u.%u\n", v >> 16, (v >> 8) & 0xff, v & 0xff);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    return stow__cli_usage_error(NULL, "unknown command '%s' (replay, plan, peak, report, diff, "
                                       "import or version)",
                                 cmd);
}
