/*
 * cli/cmd_import.c: `stowage import rmm IN.csv -o OUT.rep`, logs of other
 * allocators to the .rep trace format. PyTorch memory snapshots are imported
 * by python/stowage/snapshot_import.py (a pickle needs Python).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "report/report.h"

static void import_usage(FILE *f)
{
    fprintf(f, "usage: stowage import rmm IN.csv -o OUT.rep\n"
               "\n"
               "OUT.rep '-' is standard output (the counts then go to standard error alone).\n"
               "Converts RMM's logging_resource_adaptor CSV (Thread,Time,Action,Pointer,Size,\n"
               "Stream) to a .rep trace: pointers become dense ids, streams dense indices;\n"
               "'allocate failure' rows are counted and left out. Malformed input is\n"
               "reported as FILE:LINE: reason.\n"
               "PyTorch snapshots: python -m stowage import pytorch IN.pickle -o OUT.rep\n"
               "Exit status: 0 ok, 2 bad usage or input.\n");
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        char *grown = realloc(buf, cap * 2);
        if (!grown) {
            free(buf);
            buf = NULL;
        }
        buf = grown, cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

int stow__cli_import(int argc, char **argv)
{
    const char *format = NULL, *in = NULL, *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            import_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o")) {
            if (i + 1 == argc)
                return stow__cli_usage_error("import", "option '-o' needs a value");
            if (out_path)
                return stow__cli_usage_error("import", "-o given twice");
            out_path = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return stow__cli_usage_error("import", "unknown option '%s'", argv[i]);
        } else if (!format) {
            format = argv[i];
        } else if (!in) {
            in = argv[i];
        } else {
            return stow__cli_usage_error("import", "one input only ('%s' and '%s')", in, argv[i]);
        }
    }
    if (!format || !in)
        return stow__cli_usage_error("import", "give a format and an input: import rmm IN.csv "
                                               "-o OUT.rep");
    if (!out_path)
        return stow__cli_usage_error("import", "no output: give -o OUT.rep (or -o - for standard "
                                               "output)");
    if (strcmp(format, "rmm"))
        return stow__cli_usage_error("import", "unknown format '%s' (rmm; PyTorch snapshots: "
                                               "python -m stowage import pytorch)",
                                     format);
    struct stat sb;
    if (stat(in, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "stowage import: %s: is a directory, not an RMM log\n", in);
        return 2;
    }
    size_t len = 0;
    errno = 0;
    char *text = read_all(in, &len);
    if (!text) {
        fprintf(stderr, "stowage import: %s: %s\n", in, errno ? strerror(errno) : "cannot read");
        return 2;
    }
    FILE *out = stow__cli_open_out(out_path, "w");
    if (!out) {
        fprintf(stderr, "stowage import: %s: cannot write\n", out_path);
        free(text);
        return 2;
    }
    char err[512] = "";
    stow_rmm_import_stats_t s;
    stow_status_t st = stow__rmm_import(in, text, len, out, &s, err, sizeof err);
    free(text);
    if (stow__cli_close_out(out) != 0 && st == STOW_OK)
        st = STOW_EIO;
    if (st != STOW_OK) {
        fprintf(stderr, "stowage import: %s\n", st == STOW_EPARSE ? err : stow_strerror(st));
        if (!stow__cli_is_stdout(out_path))
            remove(out_path);
        return 2;
    }
    fprintf(stderr,
            "wrote %s: %llu allocations, %llu frees, %u stream(s), %llu never freed, "
            "%llu allocate failures and %llu allocations of 0 bytes left out\n",
            stow__cli_is_stdout(out_path) ? "standard output" : out_path,
            (unsigned long long)s.allocations, (unsigned long long)s.frees, s.streams,
            (unsigned long long)s.still_live, (unsigned long long)s.failures,
            (unsigned long long)s.zero_size);
    return 0;
}
