/*
 * tests/unit/test_fault_sweep.c: fault-injection sweep (docs/reliability.md).
 *
 * Replays a trace (the bundled ResNet-50 trace, and a synthetic multi-stream
 * one with record_stream) once cleanly to count the backend calls of each
 * kind, then once per k failing the k-th call of that kind (every k when there
 * are at most SWEEP_MAX_RUNS calls, an even sample of SWEEP_MAX_RUNS
 * otherwise), with each injectable status. In every run: calls return errors,
 * never crash; the books match a shadow model (allocation count) after every
 * event; stow_pool_check passes right after the fault fired and at the end;
 * after the remaining blocks are freed, stow_pool_destroy returns STOW_OK and
 * the device holds nothing. Creation is swept too (mem_info failing).
 * Each test logs the number of faults it injected.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_support.h"

#define MIB ((size_t)1 << 20)
#define SWEEP_MAX_RUNS 600

typedef struct sweep_event {
    uint64_t size;   /* alloc: requested bytes */
    uint32_t id;
    uint8_t kind;    /* 'a' or 'f' */
    uint8_t stream;  /* stream index */
    int16_t use;     /* alloc: record_stream on this stream index, or -1 */
} sweep_event_t;

typedef struct sweep_trace {
    sweep_event_t *ev;
    size_t n;
    uint32_t ids;
    size_t capacity; /* device capacity for the replay (0 = unlimited) */
} sweep_trace_t;

static unsigned long long faults_injected, runs_done;

static stow_stream_t stream_of(unsigned i) { return i ? (stow_stream_t)(uintptr_t)(0x100 + i) : NULL; }

static void check_pool(stow_pool_t *pool, const char *when, size_t i)
{
    char why[256];
    cr_assert_eq(stow_pool_check(pool, why, sizeof why), STOW_OK, "%s (event %zu): %s", when, i,
                 why);
}

static uint64_t failures(stow_backend_t *sim)
{
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    uint64_t n = 0;
    for (int k = 0; k < STOW_SIM_CALL_KINDS; k++)
        n += c.failures[k];
    return n;
}

/* One replay with the n-th call of `kind` failing with `status` (n = 0: none).
 * Returns the calls of each kind made during the replay (for the clean run). */
static void replay(const sweep_trace_t *t, stow_sim_call_t kind, uint64_t n, stow_status_t status,
                   stow_sim_counters_t *calls_out)
{
    stow_backend_t *sim = ts_sim(t->capacity, false, false);
    cr_assert_not_null(sim);
    stow_pool_t *pool = NULL;
    if (n)
        stow_sim_fail_nth(sim, kind, n, status);
    stow_status_t st = stow_pool_create(NULL, sim, &pool);
    if (st != STOW_OK) {
        /* Only mem_info is called at creation. */
        cr_assert(kind == STOW_SIM_MEM_INFO && n == 1, "create: %s", stow_strerror(st));
        cr_assert_eq(st, STOW_EBACKEND);
        faults_injected += failures(sim);
        cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
        runs_done++;
        return;
    }
    void **ptrs = calloc(t->ids, sizeof *ptrs);
    cr_assert_not_null(ptrs);
    uint64_t live = 0, fails_seen = 0;
    for (size_t i = 0; i < t->n; i++) {
        const sweep_event_t *e = &t->ev[i];
        if (e->kind == 'a') {
            void *p = NULL;
            st = stow_pool_alloc(pool, e->size, stream_of(e->stream), &p);
            if (st == STOW_OK) {
                ptrs[e->id] = p;
                live++;
                if (e->use >= 0) {
                    st = stow_record_stream(pool, p, stream_of((unsigned)e->use));
                    cr_assert(st == STOW_OK || st == STOW_EHOSTMEM, "record_stream: %s",
                              stow_strerror(st));
                }
            } else {
                cr_assert(st == STOW_ENOMEM || st == STOW_EBACKEND, "alloc: %s",
                          stow_strerror(st));
                cr_assert_null(p);
            }
        } else if (ptrs[e->id]) {
            st = stow_pool_free(pool, ptrs[e->id]);
            if (st == STOW_OK) {
                ptrs[e->id] = NULL;
                live--;
            } else {
                cr_assert_eq(st, STOW_EBACKEND, "free: %s", stow_strerror(st));
                cr_assert_eq(stow_pool_block_size(pool, ptrs[e->id], NULL, NULL), STOW_OK,
                             "a failed free released the block");
            }
        }
        stow_stats_t s;
        cr_assert_eq(stow_pool_stats(pool, &s), STOW_OK);
        cr_assert_eq(s.allocation[STOW_POOL_ALL].current, live, "event %zu", i);
        uint64_t f = failures(sim);
        if (f != fails_seen) { /* the fault fired during this event */
            fails_seen = f;
            check_pool(pool, "after the fault", i);
        }
    }
    if (calls_out)
        stow_sim_counters(sim, calls_out);
    stow_sim_fail_nth(sim, kind, 0, STOW_OK);
    check_pool(pool, "end of replay", t->n);
    for (uint32_t id = 0; id < t->ids; id++)
        if (ptrs[id])
            cr_assert_eq(stow_pool_free(pool, ptrs[id]), STOW_OK, "final free");
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    check_pool(pool, "after the final frees", t->n);
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.reserved_bytes, 0, "device still holds %llu bytes",
                 (unsigned long long)c.reserved_bytes);
    cr_assert_eq(c.live_reservations, 0);
    for (int k = 0; k < STOW_SIM_CALL_KINDS; k++)
        faults_injected += c.failures[k];
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
    free(ptrs);
    runs_done++;
}

static void sweep(const sweep_trace_t *t, const char *name)
{
    faults_injected = runs_done = 0;
    stow_sim_counters_t clean;
    replay(t, STOW_SIM_RESERVE, 0, STOW_OK, &clean);
    cr_assert_eq(faults_injected, 0, "clean replay of %s failed a call", name);
    static const stow_sim_call_t kinds[] = {STOW_SIM_RESERVE,      STOW_SIM_RELEASE,
                                            STOW_SIM_EVENT_RECORD, STOW_SIM_EVENT_QUERY,
                                            STOW_SIM_EVENT_DESTROY, STOW_SIM_SYNCHRONIZE,
                                            STOW_SIM_MEM_INFO};
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
        stow_sim_call_t kind = kinds[ki];
        /* Calls during the replay; mem_info also once at creation. */
        uint64_t calls = clean.calls[kind] + (kind == STOW_SIM_MEM_INFO ? 1 : 0);
        uint64_t step = calls > SWEEP_MAX_RUNS ? calls / SWEEP_MAX_RUNS : 1;
        for (uint64_t k = 1; k <= calls; k += step) {
            replay(t, kind, k, kind == STOW_SIM_RESERVE ? STOW_ENOMEM : STOW_EBACKEND, NULL);
            if (kind == STOW_SIM_RESERVE)
                replay(t, kind, k, STOW_EBACKEND, NULL);
        }
        cr_log_info("%s: %s: %llu calls swept (step %llu)", name, stow_sim_call_name(kind),
                    (unsigned long long)calls, (unsigned long long)step);
    }
    fprintf(stderr, "fault_sweep %s: %llu replays, %llu faults injected\n", name, runs_done,
            faults_injected);
    cr_assert_gt(faults_injected, 0);
}

static sweep_trace_t load_rep(const char *path)
{
    stow_trace_t *tr;
    char err[256];
    cr_assert_eq(stow_trace_load(path, &tr, err, sizeof err), STOW_OK, "%s", err);
    sweep_trace_t t = {calloc(tr->event_count, sizeof(sweep_event_t)), tr->event_count,
                       tr->id_count, 0};
    cr_assert_not_null(t.ev);
    for (size_t i = 0; i < tr->event_count; i++) {
        const stow_trace_event_t *e = &tr->events[i];
        t.ev[i] = (sweep_event_t){e->size_bytes, e->id, e->kind, (uint8_t)(e->stream % 8), -1};
    }
    stow_trace_free(tr);
    return t;
}

/* Four streams, sizes from 512 B to 24 MiB, every 5th block also used on
 * another stream, a device small enough that reservations fail and retry. */
static sweep_trace_t synthetic(void)
{
    enum { IDS = 1500 };
    sweep_trace_t t = {calloc(2 * IDS, sizeof(sweep_event_t)), 0, IDS, 160 * MIB};
    cr_assert_not_null(t.ev);
    uint64_t rng = 42;
    uint32_t live[64];
    unsigned n_live = 0;
    for (uint32_t id = 0; id < IDS; id++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t r = rng >> 16;
        size_t size = (r % 4 == 0) ? 1 + (size_t)(r >> 8) % (24 * MIB) : 1 + (size_t)(r >> 8) % 65536;
        uint8_t stream = (uint8_t)((r >> 40) % 4);
        int16_t use = id % 5 == 0 ? (int16_t)((stream + 1) % 4) : -1;
        t.ev[t.n++] = (sweep_event_t){size, id, 'a', stream, use};
        live[n_live++] = id;
        while (n_live == 64 || (n_live && (r >> 50) % 3 == 0)) {
            unsigned i = (unsigned)((r >> 20) % n_live);
            t.ev[t.n++] = (sweep_event_t){0, live[i], 'f', 0, -1};
            live[i] = live[--n_live];
            r /= 3;
        }
    }
    return t;
}

Test(fault_sweep, resnet50_trace, .timeout = 600)
{
    sweep_trace_t t = load_rep(STOW_SOURCE_DIR "/bench/traces/resnet50_train.rep");
    sweep(&t, "resnet50_train.rep");
    free(t.ev);
}

Test(fault_sweep, resnet50_trace_tight_device, .timeout = 600)
{
    sweep_trace_t t = load_rep(STOW_SOURCE_DIR "/bench/traces/resnet50_train.rep");
    t.capacity = 5000 * MIB; /* below the classic pool's reserved peak: OOM retries run */
    sweep(&t, "resnet50_train.rep (5000 MiB device)");
    free(t.ev);
}

Test(fault_sweep, synthetic_multistream, .timeout = 600)
{
    sweep_trace_t t = synthetic();
    sweep(&t, "synthetic 4-stream");
    free(t.ev);
}

/* Random faults on every kind at once, many seeds: never a crash, never a leak. */
Test(fault_sweep, random_faults_every_kind, .timeout = 600)
{
    sweep_trace_t t = synthetic();
    faults_injected = runs_done = 0;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        stow_backend_t *sim = ts_sim(t.capacity, false, false);
        stow_pool_t *pool;
        cr_assert_eq(stow_pool_create(NULL, sim, &pool), STOW_OK);
        for (int k = 0; k < STOW_SIM_CALL_KINDS; k++)
            stow_sim_fail_random(sim, (stow_sim_call_t)k, 3 + (uint32_t)(seed % 5), seed * 31 + (uint64_t)k);
        void **ptrs = calloc(t.ids, sizeof *ptrs);
        for (size_t i = 0; i < t.n; i++) {
            const sweep_event_t *e = &t.ev[i];
            if (e->kind == 'a') {
                if (stow_pool_alloc(pool, e->size, stream_of(e->stream), &ptrs[e->id]) == STOW_OK &&
                    e->use >= 0)
                    (void)stow_record_stream(pool, ptrs[e->id], stream_of((unsigned)e->use));
            } else if (ptrs[e->id] && stow_pool_free(pool, ptrs[e->id]) == STOW_OK) {
                ptrs[e->id] = NULL;
            }
        }
        check_pool(pool, "random faults", t.n);
        for (int k = 0; k < STOW_SIM_CALL_KINDS; k++)
            stow_sim_fail_random(sim, (stow_sim_call_t)k, 0, 0);
        for (uint32_t id = 0; id < t.ids; id++)
            if (ptrs[id])
                cr_assert_eq(stow_pool_free(pool, ptrs[id]), STOW_OK);
        cr_assert_eq(stow_empty_cache(pool), STOW_OK);
        check_pool(pool, "random faults, freed", t.n);
        cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
        stow_sim_counters_t c;
        stow_sim_counters(sim, &c);
        cr_assert_eq(c.reserved_bytes, 0);
        for (int k = 0; k < STOW_SIM_CALL_KINDS; k++)
            faults_injected += c.failures[k];
        cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
        free(ptrs);
        runs_done++;
    }
    fprintf(stderr, "fault_sweep random: %llu replays, %llu faults injected\n", runs_done,
            faults_injected);
    free(t.ev);
}

/* ---- Regressions for library bugs found by the fuzzers (docs/reliability.md,
 * regression inputs). ---- */
#include <sys/resource.h>

/* roundup_power2_divisions rounding must not wrap above 2^63: a wrapped size
 * would give STOW_OK with a 0-byte block. */
Test(fault_sweep_regress, rounding_near_size_max)
{
    stow_backend_t *sim = ts_sim(0, false, false);
    stow_config_t c;
    stow_config_default(&c);
    char err[128];
    cr_assert_eq(stow_config_parse(&c, "roundup_power2_divisions:4", err, sizeof err), STOW_OK);
    stow_pool_t *pool;
    cr_assert_eq(stow_pool_create(&c, sim, &pool), STOW_OK);
    const size_t sizes[] = {17909382853805490358ull, SIZE_MAX - ((size_t)1 << 30),
                            ((size_t)1 << 63) + ((size_t)1 << 62)};
    for (int i = 0; i < 3; i++) {
        void *p = NULL;
        stow_status_t st = stow_pool_alloc(pool, sizes[i], NULL, &p);
        cr_expect(st == STOW_EOVERFLOW || st == STOW_ENOMEM, "alloc(%zu) returned %s", sizes[i],
                  stow_strerror(st));
        check_pool(pool, "after a huge request", (size_t)i);
    }
    stow_pool_destroy_force(pool);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

/* The header alone must not make stow_trace_parse allocate: trusted, this one
 * would ask for 64 GiB + 128 GiB. */
Test(fault_sweep_regress, trace_header_does_not_drive_allocation)
{
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /* A relapse would try to allocate 192 GiB: make that fail fast instead.
     * (Sanitizers reserve terabytes of address space: no limit there.) */
    struct rlimit lim = {(rlim_t)4 << 30, (rlim_t)4 << 30};
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
#endif
    static const char text[] = "4294967295 8589934590\n";
    stow_trace_t *t = NULL;
    char err[256];
    stow_status_t st = stow_trace_parse("r3", text, sizeof text - 1, &t, err, sizeof err);
    cr_assert_eq(st, STOW_EPARSE, "returned %s (%s)", stow_strerror(st), err);
    /* Sparse ids far beyond the events are refused too (the id table would be huge). */
    static const char sparse[] = "4294967295 2\na 4294967294 5 0\nf 4294967294\n";
    st = stow_trace_parse("r3b", sparse, sizeof sparse - 1, &t, err, sizeof err);
    cr_assert_eq(st, STOW_EPARSE, "returned %s (%s)", stow_strerror(st), err);
    cr_assert_not_null(strstr(err, "r3b:2: "), "%s", err);
}
