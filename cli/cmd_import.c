/*
 * cli/cmd_import.c: `stowage import rmm IN.csv -o OUT.rep`, logs of other
 * allocators to the .rep trace format. PyTorch memory snapshots are imported
 * by python/stowage/snapshot_import.py (a pickle needs Python).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "report/report.h"

static void import_usage(FILE *f)
{
    fprintf(f, "usage: stowage import rmm IN.csv -o OUT.rep\n"
               "\n"
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
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            out_path = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "stowage import: unknown option or missing value '%s'\n", argv[i]);
            return 2;
        } else if (!format) {
            format = argv[i];
        } else if (!in) {
            in = argv[i];
        } else {
            import_usage(stderr);
            return 2;
        }
    }
    if (!format || !in || !out_path) {
        import_usage(stderr);
        return 2;
    }
    if (strcmp(format, "rmm")) {
        fprintf(stderr, "stowage import: unknown format '%s' (rmm; PyTorch snapshots: "
                        "python -m stowage import pytorch)\n", format);
        return 2;
    }
    size_t len = 0;
    char *text = read_all(in, &len);
    if (!text) {
        fprintf(stderr, "stowage import: %s: cannot read\n", in);
        return 2;
    }
    FILE *out = fopen(out_path, "w");
    if (!out) {
        fprintf(stderr, "stowage import: %s: cannot write\n", out_path);
        free(text);
        return 2;
    }
    char err[512] = "";
    stow_rmm_import_stats_t s;
    stow_status_t st = stow__rmm_import(in, text, len, out, &s, err, sizeof err);
    free(text);
    if (fclose(out) != 0 && st == STOW_OK)
        st = STOW_EIO;
    if (st != STOW_OK) {
        fprintf(stderr, "stowage import: %s\n", st == STOW_EPARSE ? err : stow_strerror(st));
        remove(out_path);
        return 2;
    }
    fprintf(stderr,
            "wrote %s: %llu allocations, %llu frees, %u stream(s), %llu never freed, "
            "%llu allocate failures and %llu allocations of 0 bytes left out\n",
            out_path, (unsigned long long)s.allocations, (unsigned long long)s.frees, s.streams,
            (unsigned long long)s.still_live, (unsigned long long)s.failures,
            (unsigned long long)s.zero_size);
    return 0;
}
