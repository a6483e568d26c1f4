/*
 * bench/gpu/replay_cuda.c: replays .rep traces through a Stowage pool on the
 * CUDA backend (device 0): a fresh pool per trace, configured by --conf (the
 * settings of STOWAGE_CONF and the constants of stowage/tuning.h). The
 * first (cold) pass fills the pool; then WARM_PASSES more, whose median
 * ns/event is reported (one pass of a 10,000-event trace lasts about a
 * millisecond, too short to time once). It counts the driver calls the pool
 * makes through a wrapper of the backend, so that a warm pass that still
 * reaches the driver shows which calls it makes, and prints, for a
 * page-mapped pool, the map and unmap calls of the cold pass and of the warm
 * ones and the step plans taken.
 * Usage: replay_cuda OUT.json [--conf KEY:VALUE,...] TRACE.rep...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stowage.h"
#include "stowage/backend.h"
#include "stowage/cuda.h"
#include "stowage/trace.h"

#define WARM_PASSES 9

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* ---- the counting wrapper: every method forwards to the CUDA backend ---- */
enum { C_RESERVE, C_RELEASE, C_MEM_INFO, C_SYNC, C_EV_RECORD, C_EV_QUERY, C_EV_DESTROY,
       C_VA_RESERVE, C_VA_RELEASE, C_PHYS_CREATE, C_PHYS_RELEASE, C_MAP, C_UNMAP, C_SCRUB,
       C_EV_SYNC, C_KINDS };
static const char *const call_names[C_KINDS] = {
    "reserve", "release", "mem_info", "synchronize", "event_record", "event_query",
    "event_destroy", "va_reserve", "va_release", "phys_create", "phys_release", "map", "unmap",
    "scrub", "event_synchronize"};
static unsigned long long calls[C_KINDS];
static const stow_backend_t *real;

static stow_status_t w_reserve(void *c, size_t n, stow_stream_t s, void **o)
{
    calls[C_RESERVE]++;
    return real->reserve(c, n, s, o);
}
static stow_status_t w_release(void *c, void *p, size_t n)
{
    calls[C_RELEASE]++;
    return real->release(c, p, n);
}
static stow_status_t w_mem_info(void *c, size_t *f, size_t *t)
{
    calls[C_MEM_INFO]++;
    return real->mem_info(c, f, t);
}
static stow_status_t w_sync(void *c)
{
    calls[C_SYNC]++;
    return real->synchronize(c);
}
static stow_status_t w_ev_record(void *c, stow_stream_t s, stow_event_t *o)
{
    calls[C_EV_RECORD]++;
    return real->event_record(c, s, o);
}
static stow_status_t w_ev_query(void *c, stow_event_t e, bool *d)
{
    calls[C_EV_QUERY]++;
    return real->event_query(c, e, d);
}
static stow_status_t w_ev_destroy(void *c, stow_event_t e)
{
    calls[C_EV_DESTROY]++;
    return real->event_destroy(c, e);
}
static stow_status_t w_va_reserve(void *c, size_t n, void **o)
{
    calls[C_VA_RESERVE]++;
    return real->va_reserve(c, n, o);
}
static stow_status_t w_va_release(void *c, void *v, size_t n)
{
    calls[C_VA_RELEASE]++;
    return real->va_release(c, v, n);
}
static stow_status_t w_phys_create(void *c, size_t n, stow_phys_t *o)
{
    calls[C_PHYS_CREATE]++;
    return real->phys_create(c, n, o);
}
static stow_status_t w_phys_release(void *c, stow_phys_t h, size_t n)
{
    calls[C_PHYS_RELEASE]++;
    return real->phys_release(c, h, n);
}
static stow_status_t w_map(void *c, void *v, size_t n, stow_phys_t h)
{
    calls[C_MAP]++;
    return real->map(c, v, n, h);
}
static stow_status_t w_unmap(void *c, void *v, size_t n)
{
    calls[C_UNMAP]++;
    return real->unmap(c, v, n);
}
static stow_status_t w_scrub(void *c, void *p, size_t n, stow_stream_t s)
{
    calls[C_SCRUB]++;
    return real->scrub(c, p, n, s);
}
static stow_status_t w_ev_sync(void *c, stow_event_t e)
{
    calls[C_EV_SYNC]++;
    return real->event_synchronize(c, e);
}

/* The wrapper of b: its methods where b has them, NULL where b has none. */
static stow_backend_t counting(const stow_backend_t *b)
{
    real = b;
    stow_backend_t w = *b;
#define WRAP(field, fn) w.field = b->field ? fn : NULL
    WRAP(reserve, w_reserve);
    WRAP(release, w_release);
    WRAP(mem_info, w_mem_info);
    WRAP(synchronize, w_sync);
    WRAP(event_record, w_ev_record);
    WRAP(event_query, w_ev_query);
    WRAP(event_destroy, w_ev_destroy);
    WRAP(va_reserve, w_va_reserve);
    WRAP(va_release, w_va_release);
    WRAP(phys_create, w_phys_create);
    WRAP(phys_release, w_phys_release);
    WRAP(map, w_map);
    WRAP(unmap, w_unmap);
    WRAP(scrub, w_scrub);
    WRAP(event_synchronize, w_ev_sync);
#undef WRAP
    return w;
}

/* Returns ns per event, or -1 on an allocation failure. */
static double replay(stow_pool_t *pool, const stow_trace_t *t)
{
    void **ptrs = calloc(t->id_count, sizeof *ptrs);
    if (!ptrs)
        return -1.0;
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

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Writes "name": count for each call the warm passes made, per 1000 events. */
static void print_warm_calls(FILE *out, const unsigned long long *before, size_t events)
{
    int n = 0;
    printf("    driver calls per 1000 events, warm passes:");
    fprintf(out, "\"warm_calls_per_1000_events\": {");
    for (int k = 0; k < C_KINDS; k++) {
        unsigned long long d = calls[k] - before[k];
        if (!d)
            continue;
        double per = 1000.0 * (double)d / ((double)events * WARM_PASSES);
        printf(" %s %.2f", call_names[k], per);
        fprintf(out, "%s\"%s\": %.3f", n++ ? ", " : "", call_names[k], per);
    }
    printf("%s\n", n ? "" : " none");
    fprintf(out, "}");
}

int main(int argc, char **argv)
{
    char why[512];
    stow_config_t cfg;
    stow_config_default(&cfg);
    stow_tuning_t tuning;
    stow_tuning_default(&tuning);
    int first = 2;
    if (argc > 3 && strcmp(argv[2], "--conf") == 0) {
        if (stow_tuning_parse(&cfg, &tuning, argv[3], why, sizeof why) != STOW_OK) {
            fprintf(stderr, "--conf %s: %s\n", argv[3], why);
            return 2;
        }
        first = 4;
    }
    if (argc <= first) {
        fprintf(stderr, "usage: %s OUT.json [--conf KEY:VALUE,...] TRACE.rep...\n", argv[0]);
        return 2;
    }
    stow_backend_t *b = NULL;
    if (stow_cuda_backend_create(0, &b, why, sizeof why) != STOW_OK) {
        fprintf(stderr, "no CUDA backend: %s\n", why);
        return 1;
    }
    stow_backend_t wrapped = counting(b);
    FILE *out = fopen(argv[1], "w");
    if (!out) {
        fprintf(stderr, "cannot write %s: ", argv[1]);
        perror(NULL);
        return 1;
    }
    fprintf(out, "{");
    int rc = 0;
    for (int a = first; a < argc; a++) {
        stow_trace_t *t = NULL;
        if (stow_trace_load(argv[a], &t, why, sizeof why) != STOW_OK) {
            fprintf(stderr, "%s: %s\n", argv[a], why);
            rc = 1;
            continue;
        }
        stow_pool_t *pool = NULL;
        if (stow_pool_create_tuned(&cfg, &tuning, &wrapped, &pool) != STOW_OK) {
            stow_trace_free(t);
            rc = 1;
            continue;
        }
        double cold = replay(pool, t);
        stow_stats_t st;
        (void)stow_pool_stats(pool, &st);
        unsigned long long cold_calls = st.num_map_calls + st.num_unmap_calls;
        unsigned long long before[C_KINDS];
        memcpy(before, calls, sizeof before);
        double warm_ns[WARM_PASSES];
        int failed = cold < 0;
        for (int p = 0; p < WARM_PASSES; p++) {
            warm_ns[p] = replay(pool, t);
            failed |= warm_ns[p] < 0;
        }
        qsort(warm_ns, WARM_PASSES, sizeof warm_ns[0], by_value);
        double warm = warm_ns[WARM_PASSES / 2];
        (void)stow_pool_stats(pool, &st);
        unsigned long long warm_calls = st.num_map_calls + st.num_unmap_calls - cold_calls;
        const char *name = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];
        printf("%-28s %9zu events  cold %8.1f ns/event  warm %8.1f ns/event (median of %d, "
               "%.1f-%.1f)  peak reserved %.1f MiB  (lower bound %.1f MiB)  map+unmap cold %llu "
               "warm %llu  plans %llu\n",
               name, t->event_count, cold, warm, WARM_PASSES, warm_ns[0],
               warm_ns[WARM_PASSES - 1],
               (double)st.reserved_bytes[STOW_POOL_ALL].peak / 1048576.0,
               (double)t->peak_live_bytes / 1048576.0, cold_calls, warm_calls,
               (unsigned long long)st.num_vmm_step_plans);
        fprintf(out,
                "%s\"%s\": {\"events\": %zu, \"cold_ns_per_event\": %.1f, "
                "\"warm_ns_per_event\": %.1f, \"warm_ns_min\": %.1f, \"warm_ns_max\": %.1f, "
                "\"peak_reserved_bytes\": %llu, "
                "\"peak_live_bytes\": %llu, \"cold_map_unmap_calls\": %llu, "
                "\"warm_map_unmap_calls\": %llu, \"step_plans\": %llu, "
                "\"allowance_raises\": %llu, ",
                a > first ? ", " : "", name, t->event_count, cold, warm, warm_ns[0],
                warm_ns[WARM_PASSES - 1],
                (unsigned long long)st.reserved_bytes[STOW_POOL_ALL].peak,
                (unsigned long long)t->peak_live_bytes, cold_calls, warm_calls,
                (unsigned long long)st.num_vmm_step_plans,
                (unsigned long long)st.num_vmm_allowance_raises);
        print_warm_calls(out, before, t->event_count);
        fprintf(out, "}");
        if (failed)
            rc = 1;
        stow_pool_destroy_force(pool);
        stow_trace_free(t);
    }
    fprintf(out, "}\n");
    fclose(out);
    stow_cuda_backend_destroy(b);
    return rc;
}
