/*
 * bench/vmm_churn.c: does a page-mapped pool settle? Replays each trace again
 * and again on one warm pool per policy (vmm and classic, simulated device,
 * the trace's streams), interleaving the two policies replay by replay, and
 * prints for every replay of the vmm pool its map + unmap calls per 1000
 * events, then per trace: peak reserved / peak live of the vmm pool, the
 * steady-state churn (map + unmap per 1000 events, median of replays 3..N),
 * the replay from which the pool repeats itself (each replay's map + unmap
 * count equal to that of the replay two before: a fixed point or a two-step
 * cycle, seen at least twice), and the host cost of vmm relative to classic
 * (median of the per-replay ratios of replays 3..N: same process, same trace,
 * back to back), and how often the vmm pool waited for queued work: device
 * synchronizes and events waited on, in all, and the median per replay of
 * replays 3..N of both together. It also prints the classic pool's
 * backend calls (segment reserves and releases) replay by replay and its peak
 * reserved / peak live: whether the classic pool settles under the same
 * settings.
 *
 * With --parts P it also prints the map + unmap calls of the first replay (a
 * fresh pool, as in a real run) in P equal slices of its events: for a trace of
 * P training steps, step by step; and the classic pool's backend calls
 * (segment reserves and releases) in the same slices.
 *
 * Then it replays once more (not counted above) and prints that replay's
 * footprint: the granules some block overlapped while live. A replay whose
 * footprint is above the allowance ((1 + vmm_slack) x the live peak, or up to
 * 1 + vmm_slack_max once the pool raised it) cannot run without remapping.
 * With --who K it also prints the K events of that
 * replay that made the most map + unmap calls (event index, kind, size,
 * address, calls): which blocks keep the settled pool remapping.
 *
 *   build/vmm_churn [--replays N (default 16)] [--parts P] [--who K] [--conf KEY:VALUE,...]
 *                   TRACE...
 *
 * --conf takes STOWAGE_CONF's settings and the constants of stowage/tuning.h.
 * docs/design.md (page-mapped segments) quotes its output.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stowage.h"
#include "stowage/backend.h"
#include "stowage/sim.h"
#include "stowage/trace.h"

#define MAX_REPLAYS 100
#define MAX_PARTS 64
#define MAX_WHO 1000

typedef struct side {
    stow_policy_t policy;
    stow_backend_t *sim;
    stow_pool_t *pool;
    void **ptrs;
} side_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The first replay (0-based) from which every replay's count equals the one
 * two replays before, if at least two such equalities follow it; else -1. */
static int settled_from(const uint64_t *count, int replays)
{
    /* Invariant: count[j] == count[j - 2] for every j >= s + 2 (vacuous at first). */
    int s = replays - 2;
    while (s >= 1 && count[s + 1] == count[s - 1])
        s--;
    return replays - 2 - s >= 2 ? s : -1;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static stow_stream_t stream_of(uint32_t index)
{
    /* Distinct non-NULL handles, as the replay engine gives them. */
    return (stow_stream_t)(uintptr_t)(index + 1u);
}

static uint64_t backend_calls(stow_pool_t *pool)
{
    stow_stats_t st;
    (void)stow_pool_stats(pool, &st);
    return st.num_backend_calls;
}

/* The pool's waits for queued work: device synchronizes and single events
 * waited on (before remaps). */
static uint64_t waits(stow_pool_t *pool)
{
    stow_stats_t st;
    (void)stow_pool_stats(pool, &st);
    return st.num_sync_all_streams + st.num_event_waits;
}

static uint64_t remaps(stow_pool_t *pool)
{
    stow_stats_t st;
    (void)stow_pool_stats(pool, &st);
    return st.num_map_calls + st.num_unmap_calls;
}

/* Map + unmap calls an event made, and the address an allocation got. */
typedef struct event_note {
    uint64_t calls;
    uintptr_t addr;     /* ALLOC: the block's address (0: failed) */
    size_t block_bytes; /* ALLOC: the block's size, what the pool backs */
} event_note_t;

/* One replay of the whole trace, then frees what the trace leaves live.
 * Returns the time of the replay proper; counts allocation failures. With
 * parts > 0, part_calls[k] gets the calls of the k-th of `parts` equal slices
 * of the events (a vmm pool's map + unmap calls, a classic pool's backend
 * calls); with notes, notes[i] describes event i (a
 * statistics snapshot around every event: such a replay is not timed for real). */
static uint64_t replay(side_t *s, const stow_trace_t *t, uint64_t *failures, int parts,
                       uint64_t *part_calls, event_note_t *notes)
{
    uint64_t (*calls)(stow_pool_t *) = s->policy == STOW_POLICY_VMM ? remaps : backend_calls;
    size_t per_part = parts > 0 ? (t->event_count + (size_t)parts - 1) / (size_t)parts : 0;
    uint64_t part_start = parts > 0 ? calls(s->pool) : 0;
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < t->event_count; i++) {
        if (parts > 0 && i && i % per_part == 0) {
            uint64_t now = calls(s->pool);
            part_calls[i / per_part - 1] = now - part_start;
            part_start = now;
        }
        const stow_trace_event_t *e = &t->events[i];
        uint64_t before = notes ? remaps(s->pool) : 0;
        if (e->kind == STOW_TRACE_ALLOC) {
            if (stow_pool_alloc(s->pool, e->size_bytes, stream_of(e->stream), &s->ptrs[e->id]) !=
                STOW_OK) {
                s->ptrs[e->id] = NULL;
                ++*failures;
            }
        } else if (s->ptrs[e->id]) {
            (void)stow_pool_free(s->pool, s->ptrs[e->id]);
            s->ptrs[e->id] = NULL;
        }
        if (notes) {
            notes[i].calls = remaps(s->pool) - before;
            notes[i].addr = e->kind == STOW_TRACE_ALLOC ? (uintptr_t)s->ptrs[e->id] : 0;
            size_t requested;
            if (!notes[i].addr ||
                stow_pool_block_size(s->pool, s->ptrs[e->id], &notes[i].block_bytes,
                                     &requested) != STOW_OK)
                notes[i].block_bytes = 0;
        }
    }
    uint64_t dt = now_ns() - t0;
    if (parts > 0)
        part_calls[(t->event_count - 1) / per_part] = calls(s->pool) - part_start;
    for (uint32_t id = 0; id < t->id_count; id++)
        if (s->ptrs[id]) {
            (void)stow_pool_free(s->pool, s->ptrs[id]);
            s->ptrs[id] = NULL;
        }
    return dt;
}

/* The constants of --conf (stowage/tuning.h), beside its settings. */
static stow_tuning_t tuning;

static int side_open(side_t *s, const stow_config_t *base, stow_policy_t policy,
                     const stow_trace_t *t)
{
    stow_config_t c = *base;
    c.policy = policy;
    memset(s, 0, sizeof *s);
    s->policy = policy;
    s->ptrs = calloc(t->id_count ? t->id_count : 1, sizeof *s->ptrs);
    return s->ptrs && stow_sim_create(NULL, &s->sim) == STOW_OK &&
                   stow_pool_create_tuned(&c, &tuning, s->sim, &s->pool) == STOW_OK
               ? 0
               : -1;
}

static void side_close(side_t *s)
{
    if (s->pool)
        stow_pool_destroy_force(s->pool);
    if (s->sim)
        (void)stow_sim_destroy(s->sim);
    free(s->ptrs);
}

static const event_note_t *sort_notes;

static int cmp_event_calls(const void *a, const void *b)
{
    uint64_t x = sort_notes[*(const size_t *)a].calls, y = sort_notes[*(const size_t *)b].calls;
    return x > y ? -1 : x < y;
}

/* The `who` events of the extra replay (notes) with the most map + unmap
 * calls, most first. */
static int print_who(const char *base, const stow_trace_t *t, const event_note_t *notes, int who)
{
    size_t n = t->event_count;
    size_t *order = calloc(n ? n : 1, sizeof *order);
    if (!order) {
        fprintf(stderr, "vmm_churn: out of host memory\n");
        return 1;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        order[i] = i;
        total += notes[i].calls;
    }
    sort_notes = notes;
    qsort(order, n, sizeof *order, cmp_event_calls);
    printf("%-26s one more replay: %llu map+unmap calls; the events that made most:\n", base,
           (unsigned long long)total);
    for (size_t k = 0; k < n && k < (size_t)who && notes[order[k]].calls; k++) {
        const stow_trace_event_t *e = &t->events[order[k]];
        printf("  event %zu  %s %.1f MiB  at %#llx  %llu calls\n", order[k],
               e->kind == STOW_TRACE_ALLOC ? "alloc" : "free", (double)e->size_bytes / (1 << 20),
               (unsigned long long)notes[order[k]].addr, (unsigned long long)notes[order[k]].calls);
    }
    free(order);
    return 0;
}

typedef struct span {
    uint64_t first, last; /* granule numbers */
} span_t;

static int cmp_span(const void *a, const void *b)
{
    uint64_t x = ((const span_t *)a)->first, y = ((const span_t *)b)->first;
    return x < y ? -1 : x > y;
}

/* The granules that some block of the extra replay (notes) overlapped while
 * it was live: the replay's physical footprint. A pool that keeps every
 * granule it needs mapped needs at least this many; when it is above the
 * allowance ((1 + vmm_slack) x the live peak), a replay cannot run without
 * remapping. Returns false when out of host memory. */
static bool footprint_granules(const stow_trace_t *t, const event_note_t *notes,
                               uint64_t granule_bytes, uint64_t *out)
{
    size_t n = t->event_count, k = 0;
    span_t *spans = calloc(n ? n : 1, sizeof *spans);
    if (!spans)
        return false;
    for (size_t i = 0; i < n; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind != STOW_TRACE_ALLOC || !notes[i].addr || !notes[i].block_bytes)
            continue;
        spans[k].first = notes[i].addr / granule_bytes;
        spans[k].last = (notes[i].addr + notes[i].block_bytes - 1) / granule_bytes;
        k++;
    }
    qsort(spans, k, sizeof *spans, cmp_span);
    uint64_t count = 0, end = 0; /* end: one past the last granule counted */
    for (size_t i = 0; i < k; i++) {
        uint64_t from = spans[i].first > end ? spans[i].first : end;
        if (spans[i].last + 1 > from) {
            count += spans[i].last + 1 - from;
            end = spans[i].last + 1;
        }
    }
    free(spans);
    *out = count;
    return true;
}

/* One more replay of the settled vmm pool, noting every event (not timed):
 * its footprint, and with who > 0 the events that remapped most. */
static int extra_replay(const char *base, side_t *vmm, const stow_trace_t *t, int who)
{
    size_t n = t->event_count;
    event_note_t *notes = calloc(n ? n : 1, sizeof *notes);
    uint64_t failures = 0, footprint = 0, granule_bytes = vmm->sim->granularity_bytes;
    if (!notes) {
        fprintf(stderr, "vmm_churn: out of host memory\n");
        return 1;
    }
    (void)replay(vmm, t, &failures, 0, NULL, notes);
    int rc = 0;
    if (footprint_granules(t, notes, granule_bytes, &footprint)) {
        printf("%-26s footprint of one more replay: %llu granules = %.4f x peak live "
               "(allowance %.4f, raised up to %.4f)\n",
               base, (unsigned long long)footprint,
               (double)(footprint * granule_bytes) / (double)t->peak_live_bytes,
               1.0 + tuning.vmm_slack,
               1.0 + (tuning.vmm_slack_max > tuning.vmm_slack ? tuning.vmm_slack_max
                                                               : tuning.vmm_slack));
    } else {
        fprintf(stderr, "vmm_churn: out of host memory\n");
        rc = 1;
    }
    if (rc == 0 && who > 0)
        rc = print_who(base, t, notes, who);
    free(notes);
    return rc;
}

static int run_trace(const char *path, const stow_config_t *config, int replays, int parts,
                     int who)
{
    stow_trace_t *t;
    char err[512];
    if (stow_trace_load(path, &t, err, sizeof err) != STOW_OK) {
        fprintf(stderr, "vmm_churn: %s\n", err);
        return 2;
    }
    side_t vmm, classic;
    int rc = 0;
    if (side_open(&vmm, config, STOW_POLICY_VMM, t) || side_open(&classic, config,
                                                                STOW_POLICY_CLASSIC, t)) {
        fprintf(stderr, "vmm_churn: %s: cannot create the pools\n", path);
        rc = 1;
        goto out;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    double churn[MAX_REPLAYS], ratio[MAX_REPLAYS], wait_counts[MAX_REPLAYS];
    uint64_t count[MAX_REPLAYS], classic_calls[MAX_REPLAYS], part_remaps[MAX_PARTS];
    uint64_t part_classic_calls[MAX_PARTS];
    uint64_t failures = 0;
    printf("%-26s map+unmap / 1000 events by replay:", base);
    for (int r = 0; r < replays; r++) {
        uint64_t before = remaps(vmm.pool), classic_before = backend_calls(classic.pool);
        uint64_t waits_before = waits(vmm.pool);
        uint64_t vmm_ns = replay(&vmm, t, &failures, r == 0 ? parts : 0, part_remaps, NULL);
        uint64_t classic_ns =
            replay(&classic, t, &failures, r == 0 ? parts : 0, part_classic_calls, NULL);
        count[r] = remaps(vmm.pool) - before;
        wait_counts[r] = (double)(waits(vmm.pool) - waits_before);
        classic_calls[r] = backend_calls(classic.pool) - classic_before;
        churn[r] = 1000.0 * (double)count[r] / (double)t->event_count;
        ratio[r] = (double)vmm_ns / (double)classic_ns;
        printf(" %.1f", churn[r]);
    }
    printf("\n");
    /* The classic pool beside it: does it settle (no cudaMalloc / cudaFree)? */
    printf("%-26s classic backend calls by replay:", base);
    for (int r = 0; r < replays; r++)
        printf(" %llu", (unsigned long long)classic_calls[r]);
    stow_stats_t cst;
    (void)stow_pool_stats(classic.pool, &cst);
    printf("  (reserved/live %.4f)\n",
           (double)cst.reserved_bytes[STOW_POOL_ALL].peak / (double)t->peak_live_bytes);
    if (parts > 0) {
        printf("%-26s first replay, map+unmap by 1/%d of its events:", base, parts);
        for (int k = 0; k < parts; k++)
            printf(" %llu", (unsigned long long)part_remaps[k]);
        printf("\n%-26s first replay, classic backend calls by 1/%d of its events:", base, parts);
        for (int k = 0; k < parts; k++)
            printf(" %llu", (unsigned long long)part_classic_calls[k]);
        printf("\n");
    }
    stow_stats_t st;
    (void)stow_pool_stats(vmm.pool, &st);
    double peak_ratio = (double)st.reserved_bytes[STOW_POOL_ALL].peak / (double)t->peak_live_bytes;
    int from = replays >= 3 ? 2 : 0;
    char settled[48] = "not settled";
    int stable = settled_from(count, replays);
    if (stable >= 0)
        snprintf(settled, sizeof settled, "settled from replay %d", stable + 1);
    printf("%-26s vmm reserved/live %.4f  steady churn %.1f  %s  vmm/classic host time %.3f"
           "  failures %llu  allowance raises %llu  synchronizes %llu, event waits %llu,"
           " steady %.1f waits per replay  step plans %llu\n",
           base, peak_ratio, median(churn + from, replays - from), settled,
           median(ratio + from, replays - from), (unsigned long long)failures,
           (unsigned long long)st.num_vmm_allowance_raises,
           (unsigned long long)st.num_sync_all_streams, (unsigned long long)st.num_event_waits,
           median(wait_counts + from, replays - from),
           (unsigned long long)st.num_vmm_step_plans);
    rc = extra_replay(base, &vmm, t, who);
out:
    side_close(&vmm);
    side_close(&classic);
    stow_trace_free(t);
    return rc;
}

/* *out = arg, a whole count in 1..max; else says why and returns -1. */
static int parse_count(const char *option, const char *arg, int max, int *out)
{
    char *end;
    long n = strtol(arg, &end, 10);
    if (*end || end == arg || n < 1 || n > max) {
        fprintf(stderr, "vmm_churn: %s: '%s' is not a count in 1..%d\n", option, arg, max);
        return -1;
    }
    *out = (int)n;
    return 0;
}

int main(int argc, char **argv)
{
    int replays = 16, parts = 0, who = 0, i = 1;
    stow_config_t config;
    stow_config_default(&config);
    stow_tuning_default(&tuning);
    while (i + 1 < argc && argv[i][0] == '-') {
        char err[256];
        if (!strcmp(argv[i], "--replays")) {
            if (parse_count("--replays", argv[i + 1], MAX_REPLAYS, &replays) != 0)
                return 2;
        } else if (!strcmp(argv[i], "--parts")) {
            if (parse_count("--parts", argv[i + 1], MAX_PARTS, &parts) != 0)
                return 2;
        } else if (!strcmp(argv[i], "--who")) {
            if (parse_count("--who", argv[i + 1], MAX_WHO, &who) != 0)
                return 2;
        } else if (!strcmp(argv[i], "--conf")) {
            if (stow_tuning_parse(&config, &tuning, argv[i + 1], err, sizeof err) != STOW_OK) {
                fprintf(stderr, "vmm_churn: --conf: %s\n", err);
                return 2;
            }
        } else {
            break;
        }
        i += 2;
    }
    if (i >= argc) {
        fprintf(stderr,
                "usage: vmm_churn [--replays N (1..%d)] [--parts P (1..%d)] [--who K (1..%d)] "
                "[--conf KEY:VALUE,...] TRACE...\n",
                MAX_REPLAYS, MAX_PARTS, MAX_WHO);
        return 2;
    }
    int rc = 0;
    for (; i < argc && rc == 0; i++)
        rc = run_trace(argv[i], &config, replays, parts, who);
    return rc;
}
