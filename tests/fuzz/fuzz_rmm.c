/*
 * tests/fuzz/fuzz_rmm.c: libFuzzer target for the RMM log importer
 * (stow__rmm_import, importers/rmm_import.c, behind `stowage import rmm`).
 *
 * Any input: the importer never crashes and never reads past text_len (the
 * buffer is an exact-size heap copy). An error is STOW_EPARSE with a
 * NUL-terminated message that names the input and its line ("fuzz.csv:N: ..."),
 * or STOW_EHOSTMEM. STOW_OK only for a log whose .rep output the trace parser
 * accepts, and whose events agree with the importer's own counts: one ALLOC
 * per allocation, one FREE per free, the allocations never freed, and the
 * streams (dense indices, so as many as the trace uses).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"
#include "stowage/trace.h"
#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(stow_status_t rc, const char *err, size_t err_len)
{
    FUZZ_CHECK(rc == STOW_EPARSE || rc == STOW_EHOSTMEM, "status %d", (int)rc);
    if (rc != STOW_EPARSE)
        return;
    FUZZ_CHECK(memchr(err, '\0', err_len) != NULL, "message not terminated");
    unsigned line = 0;
    int used = 0;
    FUZZ_CHECK(sscanf(err, "fuzz.csv:%u:%n", &line, &used) == 1 && used > 0 && line > 0,
               "message does not name the file and line: '%s'", err);
}

static void check_output(const char *rep, size_t rep_len, const stow_rmm_import_stats_t *st)
{
    stow_trace_t *t = NULL;
    char err[256];
    stow_status_t rc = stow_trace_parse("fuzz.rep", rep, rep_len, &t, err, sizeof err);
    if (rc == STOW_EHOSTMEM)
        return;
    FUZZ_CHECK(rc == STOW_OK, "the importer wrote a trace the parser rejects: %s", err);
    uint64_t allocs = 0, frees = 0;
    for (size_t i = 0; i < t->event_count; i++) {
        if (t->events[i].kind == STOW_TRACE_ALLOC)
            allocs++;
        else
            frees++;
    }
    FUZZ_CHECK(allocs == st->allocations && frees == st->frees,
               "events %llu/%llu, importer counted %llu/%llu", (unsigned long long)allocs,
               (unsigned long long)frees, (unsigned long long)st->allocations,
               (unsigned long long)st->frees);
    FUZZ_CHECK(st->still_live == allocs - frees, "still live %llu, events say %llu",
               (unsigned long long)st->still_live, (unsigned long long)(allocs - frees));
    FUZZ_CHECK(allocs == 0 || st->streams == t->stream_count, "streams %u, trace uses %u",
               st->streams, t->stream_count);
    stow_trace_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1);
    FUZZ_CHECK(text != NULL, "host memory");
    if (size)
        memcpy(text, data, size);
    char *rep = NULL;
    size_t rep_len = 0;
    FILE *out = open_memstream(&rep, &rep_len);
    FUZZ_CHECK(out != NULL, "open_memstream");
    stow_rmm_import_stats_t st;
    char err[256];
    stow_status_t rc = stow__rmm_import("fuzz.csv", text, size, out, &st, err, sizeof err);
    FUZZ_CHECK(fclose(out) == 0, "fclose");
    if (rc != STOW_OK)
        check_error(rc, err, sizeof err);
    else
        check_output(rep, rep_len, &st);
    free(rep);
    free(text);
    return 0;
}
