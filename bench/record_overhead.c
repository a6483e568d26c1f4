/*
 * bench/record_overhead.c: what recording costs. Replays each trace through a
 * warm classic pool on the simulated device, alternating passes without and
 * with the event ring buffer (and a tag set), and prints the median ns/event
 * of each and their ratio. Same process, same pool, interleaved passes, so the
 * machine's noise hits both alike.
 *
 *   build/record_overhead [--repeats N] TRACE...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stowage.h"
#include "stowage/record.h"
#include "stowage/trace.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t pass(stow_pool_t *pool, const stow_trace_t *t, void **ptrs)
{
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < t->event_count; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC) {
            if (stow_pool_alloc(pool, e->size_bytes, NULL, &ptrs[e->id]) != STOW_OK)
                ptrs[e->id] = NULL;
        } else if (ptrs[e->id]) {
            (void)stow_pool_free(pool, ptrs[e->id]);
            ptrs[e->id] = NULL;
        }
    }
    uint64_t dt = now_ns() - t0;
    for (uint32_t id = 0; id < t->id_count; id++)
        if (ptrs[id]) {
            (void)stow_pool_free(pool, ptrs[id]);
            ptrs[id] = NULL;
        }
    return dt;
}

int main(int argc, char **argv)
{
    int repeats = 9, i = 1;
    /* 10^6 events (32 MB): docs/report.md says why not a power of two. */
    size_t ring_events = getenv("RING") ? (size_t)atoll(getenv("RING")) : 1000000;
    if (i + 1 < argc && !strcmp(argv[i], "--repeats")) {
        repeats = atoi(argv[i + 1]);
        i += 2;
    }
    if (i >= argc || repeats < 1 || repeats > 1000) {
        fprintf(stderr, "usage: record_overhead [--repeats N] TRACE...\n");
        return 2;
    }
    printf("%-28s %12s %12s %8s\n", "trace", "off ns/ev", "on ns/ev", "on/off");
    for (; i < argc; i++) {
        stow_trace_t *t;
        char err[512];
        if (stow_trace_load(argv[i], &t, err, sizeof err) != STOW_OK) {
            fprintf(stderr, "%s\n", err);
            return 2;
        }
        stow_backend_t *sim;
        stow_pool_t *pool;
        if (stow_sim_create(NULL, &sim) != STOW_OK || stow_pool_create(NULL, sim, &pool) != STOW_OK)
            return 1;
        void **ptrs = calloc(t->id_count, sizeof *ptrs);
        uint64_t *off = calloc((size_t)repeats, sizeof *off);
        uint64_t *on = calloc((size_t)repeats, sizeof *on);
        (void)stow_tag_set("activations", NULL);
        pass(pool, t, ptrs); /* warm the cache */
        for (int r = 0; r < repeats; r++) {
            /* Starting a recording allocates and touches its ring (32 MB),
             * which evicts the caches: each switch is followed by an untimed
             * pass so that both sides are timed warm. */
            (void)stow_record_start(pool, 0);
            pass(pool, t, ptrs);
            off[r] = pass(pool, t, ptrs);
            (void)stow_record_start(pool, ring_events);
            pass(pool, t, ptrs);
            on[r] = pass(pool, t, ptrs);
        }
        (void)stow_record_start(pool, 0);
        qsort(off, (size_t)repeats, sizeof *off, cmp_u64);
        qsort(on, (size_t)repeats, sizeof *on, cmp_u64);
        double a = (double)off[repeats / 2] / (double)t->event_count;
        double b = (double)on[repeats / 2] / (double)t->event_count;
        const char *base = strrchr(argv[i], '/');
        printf("%-28s %12.1f %12.1f %8.3f\n", base ? base + 1 : argv[i], a, b, b / a);
        stow_pool_destroy(pool);
        stow_sim_destroy(sim);
        free(ptrs);
        free(off);
        free(on);
        stow_trace_free(t);
    }
    return 0;
}
