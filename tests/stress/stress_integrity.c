/*
 * tests/stress/stress_integrity.c: every byte checked (docs/reliability.md).
 *
 * A pool of any configuration (CONF: settings and measured constants in
 * STOWAGE_CONF's syntax, as stow_tuning_parse takes them: classic, quick
 * lists, page mapping, a learned step, scrub_on_free...) on a small host-backed
 * simulated device with manual events, judged by its data alone:
 * - worker threads allocate at random sizes (bytes to tens of MiB), write a
 *   pattern over every byte of each block (a word per 8 bytes, from the
 *   block's id and the word's offset), verify every byte before each free,
 *   check live blocks now and then, and free their own blocks or blocks
 *   handed over by other threads;
 * - writes and checks are device work queued on the block's stream
 *   (stow_sim_launch), run late, when the device thread or a wait of the pool
 *   completes that stream; or, for some blocks, done by the thread itself after
 *   it completed the stream;
 * - record_stream: a check queued on another stream, which runs whenever that
 *   stream gets there;
 * - a janitor thread calls empty_cache, statistics, summaries and the pool's
 *   own check; the device is small enough for out-of-memory and
 *   release-and-retry to run;
 * - with scrub_on_free, a new block must read zero before it is written;
 * - optionally (--loop-steps) a training loop by one thread, each step begun by
 *   a marker (stow_pool_step), so that a pool that learns its step
 *   (vmm_learn_step) or plans it (planned_steps) serves planned addresses;
 * A block that shares a byte with another live block, loses a granule, is
 * remapped with other bytes, is handed out or unmapped while work queued on it
 * still runs, or is not scrubbed, fails the run at once: the check names the
 * block, its pool, the word it found (whose it is), and the device and pool
 * events over that address since the block was made; a fault (SIGSEGV or
 * SIGBUS on an unmapped granule) names the same. At the end the books must be
 * exact and the device empty; the figures (allocations, bytes written and
 * checked, out-of-memory events, remaps...) are printed.
 *
 * A plain program, so that it runs under ThreadSanitizer (tests/check/tsan.sh).
 * Usage: stress_integrity [--threads N] [--ops N | --seconds S] [--seed N]
 *        [--capacity-mib N] [--max-mib N] [--loop-steps N] [--min-plans N]
 *        [--min-remaps N] [--no-pool-check] [CONF]
 * Defaults: 4 workers, one round of 2000 operations each, seed 1, a 256 MiB
 * device, requests up to 40 MiB, policy:classic. --seconds S: rounds until S
 * seconds have passed. --loop-steps N: each round starts with N steps of the
 * loop. --min-plans / --min-remaps N: fail unless the pool planned its step /
 * remapped a handle that often (so that a mode tests what it is for).
 * --no-pool-check: the janitor leaves out stow_pool_check, so that only the
 * data judges the pool (tests/check/integrity.sh sabotage).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stowage.h"
#include "stowage/backend.h"
#include "stowage/sim.h"
#include "stowage/stats.h"

#define MIB ((size_t)1 << 20)
#define MAX_WORKERS 16
#define LIVE_PER_WORKER 24
#define MAILBOX 32
#define EXTRA_STREAMS 2
#define LOG_SIZE ((size_t)1 << 18)
#define PATTERN_KEY 0x9E3779B97F4A7C15ull

/* The data loops are left to the patterns, not the sanitizers: a pool that
 * shares bytes between blocks is caught by the patterns; ThreadSanitizer's
 * job here is the pool's own state, and AddressSanitizer does not track the
 * device's mappings. Instrumented, the loops took most of the run. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define DATA_LOOP __attribute__((no_sanitize("thread", "address")))
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define DATA_LOOP __attribute__((no_sanitize("thread", "address")))
#endif
#endif
#ifndef DATA_LOOP
#define DATA_LOOP
#endif

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "stress_integrity: %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                          \
            fflush(stderr);                                                               \
            _exit(1);                                                                     \
        }                                                                                 \
    } while (0)

/* ---- configuration ---- */
static struct {
    unsigned workers;
    unsigned long ops;   /* per worker per round */
    double seconds;      /* 0: one round of ops */
    uint64_t seed;
    size_t capacity_bytes, max_bytes;
    unsigned loop_steps;
    uint64_t min_plans, min_remaps;
    bool pool_check; /* the janitor also runs stow_pool_check */
    const char *conf;
} opt = {4, 2000, 0, 1, 256 * MIB, 40 * MIB, 0, 0, 0, true, "policy:classic"};

static stow_pool_t *pool;
static stow_backend_t *sim;     /* the device */
static stow_backend_t device;   /* what the pool sees: the device, with every call logged */
static stow_config_t cfg;
static stow_tuning_t tuning; /* the measured constants (stowage/tuning.h) */
static stow_stream_t streams[MAX_WORKERS + EXTRA_STREAMS];
static unsigned n_streams;

/* ---- blocks and patterns ---- */
typedef struct blk {
    uint32_t id;
    uint8_t *ptr;
    size_t bytes; /* the block's size: every byte of it is written and checked */
    stow_stream_t stream;
} blk_t;

static atomic_uint next_id = 1;
static atomic_ullong n_allocs, n_direct, n_queued, n_ooms, bytes_written, bytes_checked,
    bytes_zero_checked, n_cross_frees, n_records, n_loop_steps, n_work_run;

static inline uint64_t pattern_word(uint32_t id, uint64_t k)
{
    return (((uint64_t)id << 32) | (uint32_t)k) ^ PATTERN_KEY;
}

/* ---- the event log: pool and device events with the bytes they touched ---- */
enum {
    EV_ALLOC, EV_FREE, EV_RECORD_STREAM, EV_RESERVE, EV_RELEASE, EV_VA_RESERVE, EV_VA_RELEASE,
    EV_MAP, EV_UNMAP, EV_SCRUB, EV_SYNC, EV_EVENT_WAIT, EV_COMPLETE, EV_EMPTY_CACHE,
    EV_KINDS
};
static const char *const ev_names[EV_KINDS] = {
    "alloc", "free", "record_stream", "reserve", "release", "va_reserve", "va_release",
    "map", "unmap", "scrub", "synchronize", "event wait", "stream completed", "empty_cache"};

typedef struct ev {
    uint64_t seq;
    uintptr_t lo, hi;
    uint64_t extra; /* a stream, a handle */
    uint32_t id;    /* a block */
    uint8_t kind;
    int8_t thread;
} ev_t;

static ev_t *ev_log;
static uint64_t ev_count;
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int my_thread = -1; /* worker index; -1 main, -2 device, -3 janitor */

static void log_event(int kind, uintptr_t lo, uintptr_t hi, uint32_t id, uint64_t extra)
{
    pthread_mutex_lock(&ev_lock);
    ev_log[ev_count % LOG_SIZE] =
        (ev_t){ev_count, lo, hi, extra, id, (uint8_t)kind, (int8_t)my_thread};
    ev_count++;
    pthread_mutex_unlock(&ev_lock);
}

static const char *thread_name(int t, char *buf, size_t len)
{
    if (t >= 0)
        snprintf(buf, len, "worker %d", t);
    else
        snprintf(buf, len, "%s", t == -1 ? "main" : t == -2 ? "device thread" : "janitor");
    return buf;
}

static void print_event(const ev_t *e, const char *prefix)
{
    char who[32];
    fprintf(stderr, "%s#%llu %s by %s", prefix, (unsigned long long)e->seq, ev_names[e->kind],
            thread_name(e->thread, who, sizeof who));
    if (e->hi > e->lo)
        fprintf(stderr, " [%#lx, %#lx)", (unsigned long)e->lo, (unsigned long)e->hi);
    if (e->id)
        fprintf(stderr, " block #%u", e->id);
    if (e->kind == EV_MAP)
        fprintf(stderr, " handle %llu", (unsigned long long)e->extra);
    else if (e->extra && e->kind != EV_MAP)
        fprintf(stderr, " stream %#llx", (unsigned long long)e->extra);
    fputc('\n', stderr);
}

/* How a block's bytes were found wrong. */
enum { SEEN_WORD, SEEN_NOT_ZERO, SEEN_FAULT };

static bool ev_over(const ev_t *e, uintptr_t addr) { return e->lo <= addr && addr < e->hi; }

/* The events over addr, oldest first, back to the allocation of block id
 * (and of block other, whose word was found there, when it came first), and
 * the one that broke it: the first after block id's allocation that is not
 * of block id itself; with none, for a word that should have been zero, the
 * previous owner's free that no scrub over addr followed; for a fault, the
 * allocation of block id over a granule not mapped then. Called when the run
 * fails (from a fault handler too: the log is read without its lock then). */
static void print_events_over(uintptr_t addr, uint32_t id, uint32_t other, int seen,
                              bool locked)
{
    if (locked)
        pthread_mutex_lock(&ev_lock);
    enum { SHOW = 24 };
    ev_t found[SHOW], mapping = {0};
    unsigned n = 0;
    bool seen_id = !id, seen_other = !other || other == id, have_mapping = false;
    uint64_t end = ev_count, start = end > LOG_SIZE ? end - LOG_SIZE : 0, i = end;
    while (i-- > start && n < SHOW && !(seen_id && seen_other)) {
        const ev_t *e = &ev_log[i % LOG_SIZE];
        if (!ev_over(e, addr))
            continue;
        found[n++] = *e;
        seen_id |= e->kind == EV_ALLOC && e->id == id;
        seen_other |= e->kind == EV_ALLOC && e->id == other;
    }
    /* The granule's mapping when block id was handed out. */
    for (i++; seen == SEEN_FAULT && i-- > start;) {
        const ev_t *e = &ev_log[i % LOG_SIZE];
        if (ev_over(e, addr) && (e->kind == EV_MAP || e->kind == EV_UNMAP ||
                                 e->kind == EV_VA_RESERVE || e->kind == EV_RESERVE)) {
            mapping = *e;
            have_mapping = true;
            break;
        }
    }
    if (locked)
        pthread_mutex_unlock(&ev_lock);
    fprintf(stderr, "  pool and device events over %#lx (the newest %u, oldest first):\n",
            (unsigned long)addr, n);
    const ev_t *culprit = NULL, *alloc = NULL, *last_free = NULL;
    bool scrubbed = false;
    for (unsigned k = n; k-- > 0;) {
        const ev_t *e = &found[k];
        print_event(e, "    ");
        if (e->kind == EV_ALLOC && e->id == id) {
            alloc = e;
        } else if (alloc && !culprit && e->id != id) {
            culprit = e;
        } else if (!alloc && e->kind == EV_FREE) {
            last_free = e;
            scrubbed = false;
        } else if (!alloc && e->kind == EV_SCRUB) {
            scrubbed = true;
        }
    }
    if (culprit) {
        print_event(culprit, "  the event that broke it: ");
    } else if (seen == SEEN_NOT_ZERO && last_free && !scrubbed) {
        print_event(last_free, "  the event that broke it (no scrub over the address after it): ");
    } else if (seen == SEEN_FAULT && alloc && have_mapping && mapping.kind != EV_MAP) {
        print_event(alloc, "  the event that broke it (handed out over a granule not mapped): ");
        print_event(&mapping, "    the granule's last mapping event before it: ");
    } else if (id) {
        fprintf(stderr, "  none found over it since block #%u was allocated: work queued on the "
                        "bytes ran late, or the event has left the log\n", id);
    }
}

static void describe_pool(void)
{
    fprintf(stderr, "  pool: \"%s\" (policy %s) on a %zu MiB host-backed simulated device\n",
            opt.conf, cfg.policy == STOW_POLICY_VMM ? "vmm" : "classic",
            opt.capacity_bytes / MIB);
}

/* ---- what a thread is touching, for the fault handler ---- */
typedef struct access {
    const blk_t *b;
    const char *what;
} access_t;
/* volatile: stored before each access even though nothing here reads it */
static _Thread_local const access_t *volatile touching;

static void on_fault(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    uintptr_t addr = (uintptr_t)si->si_addr;
    char who[32];
    fprintf(stderr, "stress_integrity: FAULT (%s) at %#lx in %s\n", sig == SIGBUS ? "SIGBUS" : "SIGSEGV",
            (unsigned long)addr, thread_name(my_thread, who, sizeof who));
    const access_t *a = touching;
    if (a) {
        fprintf(stderr, "  during %s of block #%u [%p, +%zu) on stream %p, offset %zu\n", a->what,
                a->b->id, (void *)a->b->ptr, a->b->bytes, a->b->stream,
                (size_t)(addr - (uintptr_t)a->b->ptr));
        describe_pool();
        print_events_over(addr, a->b->id, 0, SEEN_FAULT, false);
    } else {
        fprintf(stderr, "  outside the stress's own data accesses (the device's own work)\n");
        describe_pool();
        print_events_over(addr, 0, 0, SEEN_FAULT, false);
    }
    fflush(stderr);
    _exit(1);
}

/* ---- data: writes and checks ---- */
DATA_LOOP static void fill(const blk_t *b)
{
    uint64_t *w = (uint64_t *)b->ptr;
    size_t n = b->bytes / 8;
    for (size_t k = 0; k < n; k++)
        w[k] = pattern_word(b->id, k);
    atomic_fetch_add_explicit(&bytes_written, b->bytes, memory_order_relaxed);
}

/* The first word of b that is not what it should be (its pattern, or zero),
 * or SIZE_MAX. */
DATA_LOOP static size_t first_bad(const blk_t *b, bool zero, uint64_t *found)
{
    const uint64_t *w = (const uint64_t *)b->ptr;
    size_t n = b->bytes / 8;
    for (size_t k = 0; k < n; k++) {
        uint64_t v = w[k];
        if (v != (zero ? 0 : pattern_word(b->id, k))) {
            *found = v;
            return k;
        }
    }
    return SIZE_MAX;
}

static void report_corruption(const blk_t *b, const char *what, bool zero, size_t k, uint64_t v)
{
    char who[32];
    uint64_t want = zero ? 0 : pattern_word(b->id, k);
    uintptr_t addr = (uintptr_t)b->ptr + 8 * k;
    fprintf(stderr,
            "stress_integrity: CORRUPTION in block #%u [%p, +%zu), allocated on stream %p: "
            "%s in %s found at offset %zu (address %#lx) the word %#018llx instead of %#018llx",
            b->id, (void *)b->ptr, b->bytes, b->stream, what, thread_name(my_thread, who, sizeof who),
            8 * k, (unsigned long)addr, (unsigned long long)v, (unsigned long long)want);
    uint64_t g = v ^ PATTERN_KEY;
    uint32_t other = (uint32_t)(g >> 32);
    if (v == 0) {
        other = 0;
        fprintf(stderr, " (zero: scrubbed, or memory never written)\n");
    } else if (other && other < atomic_load(&next_id)) {
        fprintf(stderr, " (block #%u's word for its offset %llu)\n", other,
                (unsigned long long)(8 * (g & 0xffffffffu)));
    } else {
        other = 0;
        fprintf(stderr, " (no block's pattern)\n");
    }
    if (zero)
        fprintf(stderr, "  scrub_on_free: a new block must read zero before it is written\n");
    describe_pool();
    print_events_over(addr, b->id, other, zero ? SEEN_NOT_ZERO : SEEN_WORD, true);
    fflush(stderr);
    _exit(1);
}

static void check(const blk_t *b, const char *what, bool zero)
{
    access_t a = {b, what};
    touching = &a;
    uint64_t v = 0;
    size_t k = first_bad(b, zero, &v);
    touching = NULL;
    if (k != SIZE_MAX)
        report_corruption(b, what, zero, k, v);
    atomic_fetch_add_explicit(zero ? &bytes_zero_checked : &bytes_checked, b->bytes,
                              memory_order_relaxed);
}

static void write_block(const blk_t *b, const char *what)
{
    access_t a = {b, what};
    touching = &a;
    fill(b);
    touching = NULL;
}

/* ---- device work ---- */
enum { WORK_FILL, WORK_ZERO_THEN_FILL, WORK_CHECK };
typedef struct work {
    blk_t b;
    int kind;
} work_t;

static void work_run(void *arg)
{
    work_t *w = arg;
    if (w->kind == WORK_ZERO_THEN_FILL)
        check(&w->b, "a queued check for zero (scrub_on_free)", true);
    if (w->kind == WORK_CHECK)
        check(&w->b, "a queued check", false);
    else
        write_block(&w->b, "a queued write");
    atomic_fetch_add_explicit(&n_work_run, 1, memory_order_relaxed);
    free(w);
}

static void queue_work(const blk_t *b, stow_stream_t stream, int kind)
{
    work_t *w = malloc(sizeof *w);
    CHECK(w != NULL, "host memory");
    w->b = *b;
    w->kind = kind;
    CHECK(stow_sim_launch(sim, stream, work_run, w) == STOW_OK, "launch");
}

/* The thread itself waits for the stream (as after cudaStreamSynchronize),
 * then touches the block. */
static void complete(stow_stream_t s)
{
    log_event(EV_COMPLETE, 0, 0, 0, (uint64_t)(uintptr_t)s);
    stow_sim_complete_stream(sim, s);
}

/* ---- the device the pool sees: every call logged, misuse fatal ---- */
/* A call the device refused as against its rules (STOW_EINVAL): a pool bug. */
static void misuse(const char *call, uintptr_t addr, size_t size, stow_status_t st)
{
    if (st != STOW_EINVAL)
        return;
    fprintf(stderr, "stress_integrity: DEVICE RULE broken: the pool's %s of [%#lx, +%zu) was "
                    "refused (mapped twice, unmapped twice, or not what it reserved)\n",
            call, (unsigned long)addr, size);
    describe_pool();
    if (addr)
        print_events_over(addr, 0, 0, SEEN_WORD, true);
    fflush(stderr);
    _exit(1);
}

static stow_status_t d_reserve(void *ctx, size_t size, stow_stream_t stream, void **out)
{
    stow_status_t st = sim->reserve(ctx, size, stream, out);
    misuse("reserve", 0, size, st);
    if (st == STOW_OK)
        log_event(EV_RESERVE, (uintptr_t)*out, (uintptr_t)*out + size, 0, 0);
    return st;
}
static stow_status_t d_release(void *ctx, void *ptr, size_t size)
{
    log_event(EV_RELEASE, (uintptr_t)ptr, (uintptr_t)ptr + size, 0, 0);
    stow_status_t st = sim->release(ctx, ptr, size);
    misuse("release", (uintptr_t)ptr, size, st);
    return st;
}
static stow_status_t d_synchronize(void *ctx)
{
    log_event(EV_SYNC, 0, 0, 0, 0);
    return sim->synchronize(ctx);
}
static stow_status_t d_event_synchronize(void *ctx, stow_event_t ev)
{
    log_event(EV_EVENT_WAIT, 0, 0, 0, 0);
    stow_status_t st = sim->event_synchronize(ctx, ev);
    misuse("event_synchronize", 0, 0, st);
    return st;
}
static stow_status_t d_va_reserve(void *ctx, size_t size, void **out)
{
    stow_status_t st = sim->va_reserve(ctx, size, out);
    misuse("va_reserve", 0, size, st);
    if (st == STOW_OK)
        log_event(EV_VA_RESERVE, (uintptr_t)*out, (uintptr_t)*out + size, 0, 0);
    return st;
}
static stow_status_t d_va_release(void *ctx, void *va, size_t size)
{
    log_event(EV_VA_RELEASE, (uintptr_t)va, (uintptr_t)va + size, 0, 0);
    stow_status_t st = sim->va_release(ctx, va, size);
    misuse("va_release", (uintptr_t)va, size, st);
    return st;
}

/* Handles mapped before: a map of one of them is a remap. */
static uint8_t *mapped_before;
static size_t mapped_before_len;
static uint64_t n_remaps, n_maps; /* under the pool's lock (one pool, one device) */

static stow_status_t d_map(void *ctx, void *va, size_t size, stow_phys_t h)
{
    stow_status_t st = sim->map(ctx, va, size, h);
    misuse("map", (uintptr_t)va, size, st);
    if (st != STOW_OK)
        return st;
    log_event(EV_MAP, (uintptr_t)va, (uintptr_t)va + size, 0, h);
    n_maps++;
    if (h >= mapped_before_len) {
        size_t len = mapped_before_len ? mapped_before_len : 4096;
        while (len <= h)
            len *= 2;
        uint8_t *grown = realloc(mapped_before, len);
        CHECK(grown != NULL, "host memory");
        memset(grown + mapped_before_len, 0, len - mapped_before_len);
        mapped_before = grown;
        mapped_before_len = len;
    }
    n_remaps += mapped_before[h];
    mapped_before[h] = 1;
    return st;
}
static stow_status_t d_unmap(void *ctx, void *va, size_t size)
{
    log_event(EV_UNMAP, (uintptr_t)va, (uintptr_t)va + size, 0, 0);
    stow_status_t st = sim->unmap(ctx, va, size);
    misuse("unmap", (uintptr_t)va, size, st);
    return st;
}
static stow_status_t d_phys_release(void *ctx, stow_phys_t h, size_t size)
{
    stow_status_t st = sim->phys_release(ctx, h, size);
    misuse("phys_release", 0, size, st);
    return st;
}
static stow_status_t d_scrub(void *ctx, void *ptr, size_t size, stow_stream_t stream)
{
    log_event(EV_SCRUB, (uintptr_t)ptr, (uintptr_t)ptr + size, 0, (uint64_t)(uintptr_t)stream);
    stow_status_t st = sim->scrub(ctx, ptr, size, stream);
    misuse("scrub", (uintptr_t)ptr, size, st);
    return st;
}

static void device_open(void)
{
    stow_sim_config_t sc;
    stow_sim_config_default(&sc);
    sc.capacity_bytes = opt.capacity_bytes;
    sc.host_backed = true;
    sc.manual_events = true; /* events complete late: when the device thread says so */
    CHECK(stow_sim_create(&sc, &sim) == STOW_OK, "simulated device");
    device = *sim;
    device.reserve = d_reserve;
    device.release = d_release;
    device.synchronize = d_synchronize;
    device.event_synchronize = d_event_synchronize;
    device.va_reserve = d_va_reserve;
    device.va_release = d_va_release;
    device.map = d_map;
    device.unmap = d_unmap;
    device.phys_release = d_phys_release;
    device.scrub = d_scrub;
}

/* ---- allocation and free, each with its data ---- */
static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t pick_size(uint64_t *rng)
{
    uint64_t r = next_rand(rng);
    size_t big = opt.max_bytes > 16 * MIB ? opt.max_bytes - 16 * MIB : 1;
    switch (r % 16) {
    case 0: case 1: case 2: return 1 + (size_t)(r >> 8) % 4096;
    case 3: case 4: case 5: case 6: return 1 + (size_t)(r >> 8) % (64 << 10);
    case 7: case 8: case 9: return (64 << 10) + (size_t)(r >> 8) % MIB;
    case 10: case 11: return 1 + (size_t)(r >> 8) % (2 * MIB);
    case 12: case 13: case 14: return 1 + (size_t)(r >> 8) % (16 * MIB);
    default: return 16 * MIB + (size_t)(r >> 8) % big;
    }
}

/* Allocates size bytes on stream s and writes every byte of the block
 * (queued on s, or by the thread after s completed); false on out-of-memory. */
static bool alloc_block(size_t size, stow_stream_t s, uint64_t *rng, blk_t *out)
{
    void *p = NULL;
    stow_status_t st = stow_pool_alloc(pool, size, s, &p);
    if (st == STOW_ENOMEM) {
        atomic_fetch_add(&n_ooms, 1);
        return false;
    }
    CHECK(st == STOW_OK, "alloc %zu: %s", size, stow_strerror(st));
    size_t block = 0, req = 0;
    CHECK(stow_pool_block_size(pool, p, &block, &req) == STOW_OK && req == size && block >= size &&
              block % 8 == 0,
          "block_size of a new block");
    blk_t b = {atomic_fetch_add(&next_id, 1), p, block, s};
    log_event(EV_ALLOC, (uintptr_t)p, (uintptr_t)p + block, b.id, (uint64_t)(uintptr_t)s);
    atomic_fetch_add(&n_allocs, 1);
    if (next_rand(rng) % 4 == 0) {
        complete(s);
        if (cfg.scrub_on_free)
            check(&b, "the thread's check for zero (scrub_on_free)", true);
        write_block(&b, "the thread's write");
        atomic_fetch_add(&n_direct, 1);
    } else {
        queue_work(&b, s, cfg.scrub_on_free ? WORK_ZERO_THEN_FILL : WORK_FILL);
        atomic_fetch_add(&n_queued, 1);
    }
    *out = b;
    return true;
}

/* Checks every byte of b (queued on its stream, or by the thread after the
 * stream completed), then frees it. */
static void free_block(const blk_t *b, uint64_t *rng)
{
    if (next_rand(rng) % 4 == 0) {
        complete(b->stream);
        check(b, "the thread's check before free", false);
    } else {
        queue_work(b, b->stream, WORK_CHECK);
    }
    log_event(EV_FREE, (uintptr_t)b->ptr, (uintptr_t)b->ptr + b->bytes, b->id,
              (uint64_t)(uintptr_t)b->stream);
    stow_status_t st = stow_pool_free(pool, b->ptr);
    CHECK(st == STOW_OK, "free of block #%u: %s", b->id, stow_strerror(st));
}

/* Another stream uses b (a check queued there, after b's writes: the thread
 * orders it as a program would with an event), and says so. */
static void use_on(const blk_t *b, stow_stream_t t)
{
    complete(b->stream);
    queue_work(b, t, WORK_CHECK);
    log_event(EV_RECORD_STREAM, (uintptr_t)b->ptr, (uintptr_t)b->ptr + b->bytes, b->id,
              (uint64_t)(uintptr_t)t);
    CHECK(stow_record_stream(pool, b->ptr, t) == STOW_OK, "record_stream");
    atomic_fetch_add(&n_records, 1);
}

/* ---- workers ---- */
static pthread_mutex_t mailbox_lock = PTHREAD_MUTEX_INITIALIZER;
static blk_t mailbox[MAILBOX];
static unsigned mailbox_n;
static atomic_bool stop_helpers, loop_running;
static uint64_t round_no;
static struct timespec t_start;

static double elapsed_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t_start.tv_sec) + 1e-9 * (double)(t.tv_nsec - t_start.tv_nsec);
}

static void *worker(void *p)
{
    my_thread = (int)(intptr_t)p;
    uint64_t rng = opt.seed * 1000003u + (uint64_t)my_thread + 7919u * round_no;
    blk_t live[LIVE_PER_WORKER];
    unsigned n_live = 0;
    stow_stream_t mine = streams[my_thread];
    for (unsigned long op = 0; op < opt.ops; op++) {
        uint64_t r = next_rand(&rng);
        unsigned what = (unsigned)(r % 100);
        if (what < 42 && n_live < LIVE_PER_WORKER) {
            if (alloc_block(pick_size(&rng), mine, &rng, &live[n_live]))
                n_live++;
        } else if (what < 74 && n_live) {
            unsigned i = (unsigned)(r >> 32) % n_live;
            free_block(&live[i], &rng);
            live[i] = live[--n_live];
        } else if (what < 80 && n_live) {
            pthread_mutex_lock(&mailbox_lock);
            if (mailbox_n < MAILBOX)
                mailbox[mailbox_n++] = live[--n_live];
            pthread_mutex_unlock(&mailbox_lock);
        } else if (what < 88) {
            blk_t b;
            bool got = false;
            pthread_mutex_lock(&mailbox_lock);
            if (mailbox_n) {
                b = mailbox[--mailbox_n];
                got = true;
            }
            pthread_mutex_unlock(&mailbox_lock);
            if (got) {
                free_block(&b, &rng);
                atomic_fetch_add(&n_cross_frees, 1);
            }
        } else if (what < 94 && n_live) {
            unsigned i = (unsigned)(r >> 32) % n_live;
            stow_stream_t t = streams[(r >> 48) % n_streams];
            if (t != live[i].stream)
                use_on(&live[i], t);
        } else if (what < 97 && n_live) {
            /* A live block checked now, not only before its free: a granule
             * lost under it shows at once. */
            const blk_t *b = &live[(r >> 32) % n_live];
            if ((r >> 16) % 2) {
                complete(b->stream);
                check(b, "the thread's check of a live block", false);
            } else {
                queue_work(b, b->stream, WORK_CHECK);
            }
        } else if (what < 98) {
            complete(mine);
        }
    }
    while (n_live)
        free_block(&live[--n_live], &rng);
    return NULL;
}

/* ---- the device thread: streams complete late, in any order ---- */
static void *device_thread(void *p)
{
    (void)p;
    my_thread = -2;
    uint64_t rng = opt.seed ^ 0xD5A61266F0C9392Cull;
    while (!atomic_load(&stop_helpers)) {
        uint64_t r = next_rand(&rng);
        if (r % 64 == 0) {
            log_event(EV_SYNC, 0, 0, 0, 0);
            CHECK(sim->synchronize(sim->ctx) == STOW_OK, "synchronize");
        } else {
            complete(streams[(r >> 8) % n_streams]);
        }
        struct timespec d = {0, (long)(20000 + (r >> 40) % 300000)};
        nanosleep(&d, NULL);
    }
    return NULL;
}

/* ---- the janitor: empty_cache, statistics, summaries, the pool's check ---- */
static void check_stats(void)
{
    stow_stats_t s;
    CHECK(stow_pool_stats(pool, &s) == STOW_OK, "stats");
    for (int k = 0; k < STOW_POOL_KINDS; k++) {
        CHECK(s.requested_bytes[k].current <= s.allocated_bytes[k].current, "req > alloc");
        CHECK(s.allocated_bytes[k].current <= s.active_bytes[k].current, "alloc > active");
        CHECK(s.active_bytes[k].current <= s.reserved_bytes[k].current, "active > reserved");
        CHECK(s.reserved_bytes[k].current <= s.reserved_bytes[k].peak, "peak");
    }
    CHECK(s.reserved_bytes[STOW_POOL_ALL].current <= opt.capacity_bytes, "reserved > device");
}

static void *janitor(void *p)
{
    (void)p;
    my_thread = -3;
    uint64_t rng = opt.seed ^ 0x2545F4914F6CDD1Dull;
    static char buf[16384];
    while (!atomic_load(&stop_helpers)) {
        uint64_t r = next_rand(&rng);
        switch (r % 8) {
        case 0:
            /* A loop's learned step is dropped by empty_cache: not while it runs. */
            if (!atomic_load(&loop_running)) {
                log_event(EV_EMPTY_CACHE, 0, 0, 0, 0);
                CHECK(stow_empty_cache(pool) == STOW_OK, "empty_cache");
            }
            break;
        case 1: case 2: check_stats(); break;
        case 3: CHECK(stow_summary(pool, buf, sizeof buf) > 0, "summary"); break;
        case 4: {
            stow_stats_t s;
            CHECK(stow_pool_stats(pool, &s) == STOW_OK, "stats");
            CHECK(stow_stats_json(&s, buf, sizeof buf) > 0, "json");
            break;
        }
        case 5: {
            if (!opt.pool_check)
                break;
            char why[256];
            CHECK(stow_pool_check(pool, why, sizeof why) == STOW_OK, "pool check: %s", why);
            break;
        }
        default: break;
        }
        struct timespec d = {0, (long)(500000 + (r >> 40) % 2000000)};
        nanosleep(&d, NULL);
    }
    return NULL;
}

/* ---- a training loop by one thread (vmm_learn_step and planned_steps plan
 * from it; each step begins with a marker, and the loop ends the last) ---- */
#define LOOP_SLOTS 12
#define LOOP_PROGRAM 96

static void loop_phase(uint64_t seed)
{
    uint64_t rng = seed;
    stow_stream_t s = streams[0];
    enum { WEIGHTS = 4 };
    blk_t weights[WEIGHTS], slot_blk[LOOP_SLOTS];
    size_t slot_bytes[LOOP_SLOTS];
    bool held[LOOP_SLOTS] = {false};
    unsigned char program[LOOP_PROGRAM];
    size_t cap = opt.capacity_bytes;
    for (unsigned i = 0; i < LOOP_SLOTS; i++) {
        uint64_t r = next_rand(&rng);
        /* A few large activations and many mid-size ones: their sum (about a
         * quarter of the device) must fit beside the weights. */
        slot_bytes[i] = r % 3 == 0 ? cap / 40 + (size_t)(r >> 16) % (cap / 40)
                                   : (256 << 10) + (size_t)(r >> 16) % (cap / 80);
    }
    for (unsigned i = 0; i < LOOP_PROGRAM; i++)
        program[i] = (unsigned char)(next_rand(&rng) % LOOP_SLOTS);
    unsigned n_weights = 0;
    for (unsigned i = 0; i < WEIGHTS; i++)
        if (alloc_block(cap / 32 + i * MIB, s, &rng, &weights[n_weights]))
            n_weights++;
    for (unsigned step = 0; step < opt.loop_steps; step++) {
        CHECK(stow_pool_step(pool, "loop") == STOW_OK, "stow_pool_step");
        for (unsigned e = 0; e < LOOP_PROGRAM; e++) {
            unsigned k = program[e];
            if (held[k]) {
                free_block(&slot_blk[k], &rng);
                held[k] = false;
            } else if (alloc_block(slot_bytes[k], s, &rng, &slot_blk[k])) {
                held[k] = true;
            }
        }
        /* What the step left goes, oldest first. */
        for (unsigned k = 0; k < LOOP_SLOTS; k++)
            if (held[k]) {
                free_block(&slot_blk[k], &rng);
                held[k] = false;
            }
        atomic_fetch_add(&n_loop_steps, 1);
    }
    CHECK(stow_pool_step(pool, NULL) == STOW_OK, "stow_pool_step");
    while (n_weights)
        free_block(&weights[--n_weights], &rng);
}

/* ---- main ---- */
static void usage(void)
{
    fprintf(stderr, "usage: stress_integrity [--threads N] [--ops N | --seconds S] [--seed N] "
                    "[--capacity-mib N] [--max-mib N] [--loop-steps N] [--min-plans N] "
                    "[--min-remaps N] [--no-pool-check] [CONF]\n");
    exit(2);
}

static void parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-' || a[1] != '-') {
            opt.conf = a;
            continue;
        }
        if (!strcmp(a, "--no-pool-check")) {
            opt.pool_check = false;
            continue;
        }
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "--threads"))
            opt.workers = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--ops"))
            opt.ops = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--seconds"))
            opt.seconds = strtod(v, NULL);
        else if (!strcmp(a, "--seed"))
            opt.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--capacity-mib"))
            opt.capacity_bytes = strtoull(v, NULL, 10) * MIB;
        else if (!strcmp(a, "--max-mib"))
            opt.max_bytes = strtoull(v, NULL, 10) * MIB;
        else if (!strcmp(a, "--loop-steps"))
            opt.loop_steps = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--min-plans"))
            opt.min_plans = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--min-remaps"))
            opt.min_remaps = strtoull(v, NULL, 10);
        else
            usage();
    }
    if (opt.workers < 1 || opt.workers > MAX_WORKERS || opt.capacity_bytes < 16 * MIB ||
        opt.max_bytes < MIB)
        usage();
}

static void on_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    stow_config_default(&cfg);
    stow_tuning_default(&tuning);
    char err[256] = "";
    CHECK(stow_tuning_parse(&cfg, &tuning, opt.conf, err, sizeof err) == STOW_OK,
          "CONF \"%s\": %s", opt.conf, err);
    ev_log = calloc(LOG_SIZE, sizeof *ev_log);
    CHECK(ev_log != NULL, "host memory");
    on_signals();
    device_open();
    CHECK(stow_pool_create_tuned(&cfg, &tuning, &device, &pool) == STOW_OK, "pool \"%s\"",
          opt.conf);
    n_streams = opt.workers + EXTRA_STREAMS;
    for (unsigned i = 0; i < n_streams; i++)
        streams[i] = (stow_stream_t)(uintptr_t)(0x1000 + 0x10 * i);

    clock_gettime(CLOCK_MONOTONIC, &t_start);
    pthread_t dev, jan;
    CHECK(pthread_create(&dev, NULL, device_thread, NULL) == 0, "pthread_create");
    CHECK(pthread_create(&jan, NULL, janitor, NULL) == 0, "pthread_create");
    do {
        if (opt.loop_steps) {
            /* From an empty cache (a page-mapped pool's high-water mark
             * restarts), one thread, no empty_cache while it runs. */
            log_event(EV_EMPTY_CACHE, 0, 0, 0, 0);
            CHECK(stow_empty_cache(pool) == STOW_OK, "empty_cache");
            atomic_store(&loop_running, true);
            loop_phase(opt.seed * 31 + round_no);
            atomic_store(&loop_running, false);
        }
        pthread_t th[MAX_WORKERS];
        for (unsigned i = 0; i < opt.workers; i++)
            CHECK(pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i) == 0,
                  "pthread_create");
        for (unsigned i = 0; i < opt.workers; i++)
            pthread_join(th[i], NULL);
        round_no++;
    } while (opt.seconds > 0 && elapsed_s() < opt.seconds);
    uint64_t dummy = 0;
    for (unsigned i = 0; i < mailbox_n; i++)
        free_block(&mailbox[i], &dummy);
    atomic_store(&stop_helpers, true);
    pthread_join(dev, NULL);
    pthread_join(jan, NULL);

    /* Every queued check runs, then the books must be exact and the device empty. */
    log_event(EV_SYNC, 0, 0, 0, 0);
    CHECK(sim->synchronize(sim->ctx) == STOW_OK, "synchronize");
    CHECK(stow_empty_cache(pool) == STOW_OK, "empty_cache");
    stow_stats_t s;
    CHECK(stow_pool_stats(pool, &s) == STOW_OK, "stats");
    char why[256];
    CHECK(stow_pool_check(pool, why, sizeof why) == STOW_OK, "%s", why);
    CHECK(s.allocated_bytes[STOW_POOL_ALL].current == 0 && s.allocation[STOW_POOL_ALL].current == 0,
          "allocated %llu bytes in %llu blocks at the end",
          (unsigned long long)s.allocated_bytes[STOW_POOL_ALL].current,
          (unsigned long long)s.allocation[STOW_POOL_ALL].current);
    CHECK(s.allocation[STOW_POOL_ALL].allocated == atomic_load(&n_allocs),
          "the pool counted %llu allocations, the threads %llu",
          (unsigned long long)s.allocation[STOW_POOL_ALL].allocated,
          (unsigned long long)atomic_load(&n_allocs));
    CHECK(s.num_ooms == atomic_load(&n_ooms), "ooms %llu vs %llu", (unsigned long long)s.num_ooms,
          (unsigned long long)atomic_load(&n_ooms));
    CHECK(stow_pool_destroy(pool) == STOW_OK, "destroy");
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    CHECK(c.reserved_bytes == 0 && c.queued_work == 0, "device holds %llu bytes, %llu pieces of work",
          (unsigned long long)c.reserved_bytes, (unsigned long long)c.queued_work);
    CHECK(stow_sim_destroy(sim) == STOW_OK, "sim destroy");
    free(mapped_before);
    free(ev_log);

    double secs = elapsed_s();
    /* A learned step's plans (vmm_learn_step) and the planned layer's. */
    uint64_t plans = s.num_vmm_step_plans + s.num_plans;
    printf("stress_integrity: \"%s\" on %zu MiB, %u threads, %llu rounds in %.1f s: %llu allocations "
           "(%llu written by their thread, %llu by queued work; %llu pieces of work run late), "
           "%.2f GiB written, %.2f GiB checked, %.2f GiB checked zero, %llu cross-thread frees, %llu record_stream, %llu loop steps; %llu "
           "out-of-memory, %llu release-and-retry, %llu map / %llu unmap calls, %llu remaps, "
           "%llu event waits, %llu synchronizes, %llu scrubs, %llu step plans, %llu planned "
           "allocations; every byte as written\n",
           opt.conf, opt.capacity_bytes / MIB, opt.workers, (unsigned long long)round_no, secs,
           (unsigned long long)atomic_load(&n_allocs), (unsigned long long)atomic_load(&n_direct),
           (unsigned long long)atomic_load(&n_queued), (unsigned long long)atomic_load(&n_work_run),
           (double)atomic_load(&bytes_written) / (double)(1u << 30),
           (double)atomic_load(&bytes_checked) / (double)(1u << 30),
           (double)atomic_load(&bytes_zero_checked) / (double)(1u << 30),
           (unsigned long long)atomic_load(&n_cross_frees),
           (unsigned long long)atomic_load(&n_records),
           (unsigned long long)atomic_load(&n_loop_steps), (unsigned long long)s.num_ooms,
           (unsigned long long)s.num_alloc_retries, (unsigned long long)s.num_map_calls,
           (unsigned long long)s.num_unmap_calls, (unsigned long long)n_remaps,
           (unsigned long long)s.num_event_waits, (unsigned long long)s.num_sync_all_streams,
           (unsigned long long)s.num_scrubs, (unsigned long long)plans,
           (unsigned long long)(s.num_vmm_planned_allocations + s.num_planned_hits));
    CHECK(plans >= opt.min_plans, "%llu step plans, at least %llu wanted",
          (unsigned long long)plans, (unsigned long long)opt.min_plans);
    CHECK(n_remaps >= opt.min_remaps, "%llu remaps, at least %llu wanted",
          (unsigned long long)n_remaps, (unsigned long long)opt.min_remaps);
    return 0;
}
