/*
 * bench/gpu/replay_cuda.c: replays .rep traces through a Stowage pool on the
 * CUDA backend (device 0) and prints ns/event (second, warm pass) and peaks.
 * Usage: replay_cuda OUT.json TRACE.rep...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stowage.h"
#include "stowage/cuda.h"
#include "stowage/trace.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Returns ns per event, or -1 on an allocation failure. */
static double replay(stow_pool_t *pool, const stow_trace_t *t)
{
    void **ptrs = calloc(t->id_count, sizeof *ptrs);
    double start = now_ns();
    int failed = 0;
    for (size_t i = 0; i < t->event_count && !failed; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC) {
            if (stow_pool_alloc(pool, e->size_bytes, NULL, &ptrs[e->id]) != STOW_OK)
                failed = 1;
        } else if (ptrs[e->id]) {
            (void)stow_pool_free(pool, ptrs[e->id]);
            ptrs[e->id] = NULL;
        }
    }
    double ns = (now_ns() - start) / (double)t->event_count;
    for (uint32_t i = 0; i < t->id_count; i++)
        if (ptrs[i])
            (void)stow_pool_free(pool, ptrs[i]);
    free(ptrs);
    return failed ? -1.0 : ns;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUT.json TRACE.rep...\n", argv[0]);
        return 2;
    }
    char why[512];
    stow_backend_t *b = NULL;
    if (stow_cuda_backend_create(0, &b, why, sizeof why) != STOW_OK) {
        fprintf(stderr, "no CUDA backend: %s\n", why);
        return 1;
    }
    FILE *out = fopen(argv[1], "w");
    if (!out)
        return 1;
    fprintf(out, "{");
    int rc = 0;
    for (int a = 2; a < argc; a++) {
        stow_trace_t *t = NULL;
        if (stow_trace_load(argv[a], &t, why, sizeof why) != STOW_OK) {
            fprintf(stderr, "%s: %s\n", argv[a], why);
            rc = 1;
            continue;
        }
        stow_pool_t *pool = NULL;
        if (stow_pool_create(NULL, b, &pool) != STOW_OK) {
            stow_trace_free(t);
            rc = 1;
            continue;
        }
        double cold = replay(pool, t);
        double warm = replay(pool, t);
        stow_stats_t st;
        (void)stow_pool_stats(pool, &st);
        const char *name = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];
        printf("%-28s %9zu events  cold %8.1f ns/event  warm %8.1f ns/event  peak reserved %.1f MiB"
               "  (lower bound %.1f MiB)\n",
               name, t->event_count, cold, warm,
               (double)st.reserved_bytes[STOW_POOL_ALL].peak / 1048576.0,
               (double)t->peak_live_bytes / 1048576.0);
        fprintf(out,
                "%s\"%s\": {\"events\": %zu, \"cold_ns_per_event\": %.1f, "
                "\"warm_ns_per_event\": %.1f, \"peak_reserved_bytes\": %llu, "
                "\"peak_live_bytes\": %llu}",
                a > 2 ? ", " : "", name, t->event_count, cold, warm,
                (unsigned long long)st.reserved_bytes[STOW_POOL_ALL].peak,
                (unsigned long long)t->peak_live_bytes);
        if (cold < 0 || warm < 0)
            rc = 1;
        stow_pool_destroy_force(pool);
        stow_trace_free(t);
    }
    fprintf(out, "}\n");
    fclose(out);
    stow_cuda_backend_destroy(b);
    return rc;
}
