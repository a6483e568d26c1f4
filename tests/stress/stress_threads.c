/*
 * tests/stress/stress_threads.c: many threads on one pool (docs/reliability.md).
 *
 * N threads x M operations: alloc (512 B .. 48 MiB), free of one's own blocks,
 * free of blocks handed over by another thread, record_stream naming other
 * threads' streams, empty_cache, stats snapshots (checked for consistency),
 * rejected frees, and, on thread 0 only (scopes are per pool), scope
 * push/pop. The device is small enough that out-of-memory paths run too.
 * At the end the books must be exact: allocated 0, allocation count 0,
 * requested-bytes and invalid-free totals equal to what the threads counted,
 * stow_pool_check OK, destroy OK, nothing left on the device.
 *
 * The pool is a classic one, or with `vmm` a page-mapped one (its small
 * range, quick lists and remapping under the same threads).
 *
 * On the simulated device by default; with `cuda` on the CUDA backend, which
 * ctest and tests/check/tsan.sh run over the host-emulated driver
 * (tests/support/fake_cuda.c: 384 MiB, real streams created through it, every
 * call checked against the driver API's rules). Then the CUDA backend's own
 * state (its event pool, the per-thread context switch, the last error) runs
 * under the same threads, and at the end the driver must report no rule
 * broken and nothing left allocated, mapped, reserved or retained.
 *
 * A plain program (ThreadSanitizer cannot run Criterion): ctest runs it as
 * is, tests/check/tsan.sh builds it with -fsanitize=thread.
 * Usage: stress_threads [threads [ops_per_thread [seed [classic|vmm [sim|cuda]]]]]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"
#include "stowage.h"
#include "stowage/cuda.h"
#include "stowage/sim.h"

#define MIB ((size_t)1 << 20)
#define MAX_THREADS 16
#define LIVE_PER_THREAD 64
#define MAILBOX 32

#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "stress_threads: %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

static stow_pool_t *pool;
static stow_backend_t *sim;     /* the simulated device, or NULL on the CUDA backend */
static stow_backend_t *cuda;
static stow_stream_t cuda_streams[MAX_THREADS]; /* created through the driver */
static unsigned n_threads;
static unsigned long ops_per_thread;
static uint64_t seed0;

/* Blocks handed from one thread to another (cross-thread frees). */
static pthread_mutex_t mailbox_lock = PTHREAD_MUTEX_INITIALIZER;
static void *mailbox[MAILBOX];
static unsigned mailbox_n;

static atomic_ullong total_requested, total_invalid_frees, total_ops, total_ooms;

typedef struct thread_arg {
    unsigned index;
} thread_arg_t;

static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static stow_stream_t stream_of(unsigned i)
{
    return cuda ? cuda_streams[i] : (stow_stream_t)(uintptr_t)(0x100 + i);
}

/* A driver entry point (object -> function pointer, as POSIX allows). */
static void driver_fn(void *field, const char *name)
{
    void *sym = stow_cuda_driver_symbol(name);
    CHECK(sym != NULL, "libcuda lacks %s", name);
    memcpy(field, &sym, sizeof sym);
}

/* The CUDA backend on device 0 with one stream per thread. The emulated
 * driver reads its size at its first call. */
static void cuda_open(void)
{
    setenv("FAKE_CUDA_TOTAL_MB", "384", 0); /* small: OOM paths run, as on the sim */
    char why[512];
    stow_status_t st = stow_cuda_backend_create(0, &cuda, why, sizeof why);
    CHECK(st == STOW_OK, "CUDA backend: %s: %s", stow_strerror(st), why);
    size_t free_bytes = 0, total_bytes = 0; /* makes the primary context current here */
    CHECK(cuda->mem_info(cuda->ctx, &free_bytes, &total_bytes) == STOW_OK, "mem_info");
    int (*stream_create)(void **, unsigned) = NULL;
    driver_fn(&stream_create, "cuStreamCreate");
    for (unsigned i = 0; i < n_threads; i++)
        CHECK(stream_create(&cuda_streams[i], 1 /* non-blocking */) == 0, "cuStreamCreate");
}

/* After the pool is gone: streams destroyed, backend destroyed, and on the
 * emulated driver nothing of ours left and no rule broken. */
static void cuda_close(void)
{
    int (*stream_destroy)(void *) = NULL;
    driver_fn(&stream_destroy, "cuStreamDestroy_v2");
    for (unsigned i = 0; i < n_threads; i++)
        CHECK(stream_destroy(cuda_streams[i]) == 0, "cuStreamDestroy_v2");
    void *sym = stow_cuda_driver_symbol("fake_cuda_counters");
    stow_cuda_backend_destroy(cuda);
    if (!sym)
        return; /* a real driver */
    fake_cuda_counters_fn counters = NULL;
    memcpy(&counters, &sym, sizeof sym);
    fake_cuda_counters_t c;
    counters(&c);
    CHECK(c.violations == 0, "%llu driver API violations, the last: %s",
          (unsigned long long)c.violations, c.last_violation);
    CHECK(c.used_bytes == 0 && c.allocations == 0 && c.handles == 0 && c.mappings == 0 &&
              c.reservations == 0 && c.events == 0 && c.primary_retains == 0,
          "left in the driver: %llu bytes, %llu allocations, %llu handles, %llu mappings, "
          "%llu ranges, %llu events, %d retains",
          (unsigned long long)c.used_bytes, (unsigned long long)c.allocations,
          (unsigned long long)c.handles, (unsigned long long)c.mappings,
          (unsigned long long)c.reservations, (unsigned long long)c.events, c.primary_retains);
}

static size_t pick_size(uint64_t *rng)
{
    uint64_t r = next_rand(rng);
    switch (r % 8) {
    case 0: return 1 + (size_t)(r >> 8) % 512;
    case 1: case 2: case 3: return 1 + (size_t)(r >> 8) % (64 * 1024);
    case 4: case 5: return 1 + (size_t)(r >> 8) % MIB;
    case 6: return MIB + (size_t)(r >> 8) % (8 * MIB);
    default: return 8 * MIB + (size_t)(r >> 8) % (40 * MIB);
    }
}

static void *worker(void *p)
{
    const thread_arg_t *arg = p;
    uint64_t rng = seed0 * 1000003u + arg->index;
    void *live[LIVE_PER_THREAD];
    unsigned n_live = 0, depth = 0;
    stow_stream_t mine = stream_of(arg->index);
    for (unsigned long op = 0; op < ops_per_thread; op++) {
        uint64_t r = next_rand(&rng);
        unsigned what = (unsigned)(r % 100);
        if (what < 40 && n_live < LIVE_PER_THREAD) {
            size_t size = pick_size(&rng);
            void *q = NULL;
            stow_status_t st = stow_pool_alloc(pool, size, mine, &q);
            if (st == STOW_OK) {
                live[n_live++] = q;
                atomic_fetch_add(&total_requested, size);
            } else {
                CHECK(st == STOW_ENOMEM, "alloc %zu: %s", size, stow_strerror(st));
                atomic_fetch_add(&total_ooms, 1);
            }
        } else if (what < 75 && n_live) {
            unsigned i = (unsigned)(r >> 32) % n_live;
            CHECK(stow_pool_free(pool, live[i]) == STOW_OK, "free");
            live[i] = live[--n_live];
        } else if (what < 80 && n_live) {
            /* Hand a block to whichever thread looks at the mailbox next. */
            pthread_mutex_lock(&mailbox_lock);
            if (mailbox_n < MAILBOX) {
                mailbox[mailbox_n++] = live[--n_live];
            }
            pthread_mutex_unlock(&mailbox_lock);
        } else if (what < 85) {
            void *q = NULL;
            pthread_mutex_lock(&mailbox_lock);
            if (mailbox_n)
                q = mailbox[--mailbox_n];
            pthread_mutex_unlock(&mailbox_lock);
            if (q)
                CHECK(stow_pool_free(pool, q) == STOW_OK, "cross-thread free");
        } else if (what < 91 && n_live) {
            unsigned i = (unsigned)(r >> 32) % n_live;
            stow_stream_t other = stream_of((unsigned)(r >> 48) % n_threads);
            CHECK(stow_record_stream(pool, live[i], other) == STOW_OK, "record_stream");
        } else if (what < 92) {
            CHECK(stow_empty_cache(pool) == STOW_OK, "empty_cache");
        } else if (what < 96) {
            stow_stats_t s;
            CHECK(stow_pool_stats(pool, &s) == STOW_OK, "stats");
            for (int k = 0; k < STOW_POOL_KINDS; k++) {
                CHECK(s.requested_bytes[k].current <= s.allocated_bytes[k].current, "req > alloc");
                CHECK(s.allocated_bytes[k].current <= s.active_bytes[k].current, "alloc > active");
                CHECK(s.active_bytes[k].current <= s.reserved_bytes[k].current, "active > reserved");
                CHECK(s.reserved_bytes[k].current <= s.reserved_bytes[k].peak, "peak");
                CHECK(s.allocated_bytes[k].current ==
                          s.allocated_bytes[k].allocated - s.allocated_bytes[k].freed,
                      "allocated != allocated - freed");
            }
        } else if (what < 98) {
            /* A pointer no pool handed out: rejected, counted. */
            void *foreign = (void *)(uintptr_t)(0x7000 + 512 * (r >> 40));
            CHECK(stow_pool_free(pool, foreign) == STOW_ENOTOWNED, "foreign free");
            atomic_fetch_add(&total_invalid_frees, 1);
        } else if (arg->index == 0) {
            /* Scopes belong to the pool: only thread 0 pushes and pops. */
            if ((r >> 32) % 2 && depth < STOW_SCOPE_MAX_DEPTH) {
                unsigned d = 0;
                CHECK(stow_scope_push(pool, &d) == STOW_OK && d == depth + 1, "push");
                depth++;
            } else if (depth) {
                stow_scope_result_t res;
                CHECK(stow_scope_pop(pool, &res) == STOW_OK, "pop");
                CHECK(res.allocated_bytes_peak >= res.allocated_bytes_at_push &&
                          res.allocated_bytes_peak >= res.allocated_bytes_at_pop,
                      "scope peak");
                depth--;
            }
        }
    }
    while (n_live)
        CHECK(stow_pool_free(pool, live[--n_live]) == STOW_OK, "final free");
    while (depth--) {
        stow_scope_result_t res;
        CHECK(stow_scope_pop(pool, &res) == STOW_OK, "final pop");
    }
    atomic_fetch_add(&total_ops, ops_per_thread);
    return NULL;
}

int main(int argc, char **argv)
{
    n_threads = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 4;
    ops_per_thread = argc > 2 ? strtoul(argv[2], NULL, 10) : 500000;
    seed0 = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    const char *policy = argc > 4 ? argv[4] : "classic";
    const char *device = argc > 5 ? argv[5] : "sim";
    CHECK(n_threads >= 1 && n_threads <= MAX_THREADS, "threads 1..%d", MAX_THREADS);
    CHECK(!strcmp(policy, "classic") || !strcmp(policy, "vmm"), "policy classic or vmm");
    CHECK(!strcmp(device, "sim") || !strcmp(device, "cuda"), "device sim or cuda");

    if (!strcmp(device, "cuda")) {
        cuda_open();
    } else {
        stow_sim_config_t sc;
        stow_sim_config_default(&sc);
        sc.capacity_bytes = 384 * MIB; /* small: OOM and release-and-retry paths run */
        CHECK(stow_sim_create(&sc, &sim) == STOW_OK, "sim");
    }
    stow_config_t cfg;
    stow_config_default(&cfg);
    cfg.policy = !strcmp(policy, "vmm") ? STOW_POLICY_VMM : STOW_POLICY_CLASSIC;
    CHECK(stow_pool_create(&cfg, sim ? sim : cuda, &pool) == STOW_OK, "pool");

    pthread_t th[MAX_THREADS];
    thread_arg_t args[MAX_THREADS];
    for (unsigned i = 0; i < n_threads; i++) {
        args[i].index = i;
        CHECK(pthread_create(&th[i], NULL, worker, &args[i]) == 0, "pthread_create");
    }
    for (unsigned i = 0; i < n_threads; i++)
        pthread_join(th[i], NULL);
    for (unsigned i = 0; i < mailbox_n; i++)
        CHECK(stow_pool_free(pool, mailbox[i]) == STOW_OK, "mailbox free");

    /* Blocks freed after record_stream may still be pending: empty_cache
     * processes completed events. */
    CHECK(stow_empty_cache(pool) == STOW_OK, "empty_cache");
    stow_stats_t s;
    CHECK(stow_pool_stats(pool, &s) == STOW_OK, "stats");
    char why[256];
    CHECK(stow_pool_check(pool, why, sizeof why) == STOW_OK, "%s", why);
    CHECK(s.allocated_bytes[STOW_POOL_ALL].current == 0, "allocated %llu",
          (unsigned long long)s.allocated_bytes[STOW_POOL_ALL].current);
    CHECK(s.allocation[STOW_POOL_ALL].current == 0, "allocations %llu",
          (unsigned long long)s.allocation[STOW_POOL_ALL].current);
    CHECK(s.requested_bytes[STOW_POOL_ALL].current == 0, "requested current");
    CHECK(s.requested_bytes[STOW_POOL_ALL].allocated == atomic_load(&total_requested),
          "requested total %llu, threads counted %llu",
          (unsigned long long)s.requested_bytes[STOW_POOL_ALL].allocated,
          (unsigned long long)atomic_load(&total_requested));
    CHECK(s.num_invalid_frees == atomic_load(&total_invalid_frees), "invalid frees %llu vs %llu",
          (unsigned long long)s.num_invalid_frees,
          (unsigned long long)atomic_load(&total_invalid_frees));
    CHECK(s.num_ooms == atomic_load(&total_ooms), "ooms %llu vs %llu",
          (unsigned long long)s.num_ooms, (unsigned long long)atomic_load(&total_ooms));
    CHECK(stow_pool_destroy(pool) == STOW_OK, "destroy");
    if (sim) {
        stow_sim_counters_t c;
        stow_sim_counters(sim, &c);
        CHECK(c.reserved_bytes == 0, "device holds %llu bytes",
              (unsigned long long)c.reserved_bytes);
        CHECK(stow_sim_destroy(sim) == STOW_OK, "sim destroy");
    } else {
        cuda_close();
    }
    printf("stress_threads: %s on %s, %u threads x %lu ops = %llu ops, %llu allocations, "
           "%llu OOMs, books exact\n",
           policy, device, n_threads, ops_per_thread, (unsigned long long)atomic_load(&total_ops),
           (unsigned long long)s.allocation[STOW_POOL_ALL].allocated,
           (unsigned long long)atomic_load(&total_ooms));
    return 0;
}
