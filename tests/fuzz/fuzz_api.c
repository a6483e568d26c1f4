/*
 * tests/fuzz/fuzz_api.c: libFuzzer target for the pool API (docs/reliability.md).
 *
 * Decodes the input into a sequence of API calls on a simulated device: alloc
 * (sizes from 0 to SIZE_MAX), free (live, foreign, interior, double, NULL),
 * record_stream, empty_cache, stats/summary/JSON, peak resets, scopes, several
 * streams, manual event completion, fault injection (stow_sim_fail_nth /
 * stow_sim_fail_random on every backend call kind: a wait on one event fails
 * as a synchronize does; va_release only at teardown, where none is injected),
 * capacity changes and memory-fraction changes (stow_pool_set_memory_fraction),
 * on the classic pool (quick lists at their default depth, or a configuration
 * bit picks 0-8) or (a configuration bit) the page-mapped one (with its small
 * range and quick lists, or, a setup bit, one range for every request), on a
 * backend with events or (a setup bit) a single-stream one without them, and
 * (a setup bit) with every freed block scrubbed.
 *
 * A shadow model of the live (ptr, block, requested) set is compared with
 * stow_pool_stats after every call; stow_pool_check must pass; a returned
 * block never overlaps a live one; a rejected call changes no book. At the end
 * everything is freed, stow_pool_destroy returns STOW_OK and the device holds
 * no byte. Any violation aborts (a libFuzzer crash).
 *
 * A second model, of the device's own work (the oracle below), checks what
 * the books cannot show: that no block is handed to a stream while another
 * stream's queued work may still use its bytes, that no granule is unmapped
 * under a live block or under work still queued, and that with scrub_on_free
 * no block is handed out before a scrub covered it.
 *
 * The backend seen by the pool is a thin wrapper around the simulated device
 * that counts injected faults (failed calls that capacity does not explain) and
 * aborts if the pool ever misuses the backend (EINVAL from the device).
 *
 * Built with clang -fsanitize=fuzzer (STOW_FUZZ, tests/check/fuzz.sh); ctest
 * also links it with tests/support/fuzz_replay_main.c (replay_fuzz_api), which
 * replays the committed corpus with gcc in every build.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stowage.h"
#include "stowage/sim.h"
#include "tests/fuzz/fuzz_check.h"

#define FZ_MIB ((size_t)1 << 20)

#define FZ_MAX_LIVE 192
#define FZ_MAX_OPS 400
#define FZ_STREAMS 4


/* Totals over the process, printed at exit (docs/reliability.md figures). */
typedef struct fz_totals {
    unsigned long long inputs, ops, injected_faults;
    unsigned long long event_waits; /* events the pools waited on (event_synchronize calls) */
    unsigned long long event_wait_failures; /* of those, waits that failed (injected) */
} fz_totals_t;
static fz_totals_t fz_totals;
static int fz_verbose; /* FUZZ_API_VERBOSE=1: print each decoded call (reproducing a crash) */

/* ---- input cursor ---- */
typedef struct fz_in {
    const uint8_t *p, *end;
} fz_in_t;

static uint64_t fz_bytes(fz_in_t *in, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | (in->p < in->end ? *in->p++ : 0);
    return v;
}
static uint8_t fz_u8(fz_in_t *in) { return (uint8_t)fz_bytes(in, 1); }

/* ---- the wrapper backend ---- */
static void fz_streams_done(unsigned mask); /* the oracle, below */
static stow_backend_t *fz_sim;       /* the simulated device */
static stow_backend_t fz_backend;    /* what the pool sees */
static size_t fz_capacity;           /* current device capacity (bytes) */
static uint64_t fz_injected;         /* faults injected in this input */

static uint64_t fz_failures(void)
{
    stow_sim_counters_t c;
    stow_sim_counters(fz_sim, &c);
    uint64_t n = 0;
    for (int k = 0; k < STOW_SIM_CALL_KINDS; k++)
        n += c.failures[k];
    return n;
}

static void fz_after_call(stow_status_t st, uint64_t failures_before, bool natural,
                          const char *what)
{
    FUZZ_CHECK(st != STOW_EINVAL, "the pool misused the backend in %s", what);
    if (st != STOW_OK && !natural && fz_failures() > failures_before)
        fz_injected++;
}

static stow_status_t fz_reserve(void *ctx, size_t size, stow_stream_t stream, void **out)
{
    stow_sim_counters_t c;
    stow_sim_counters(fz_sim, &c);
    uint64_t before = fz_failures();
    bool natural = !(size <= fz_capacity && c.reserved_bytes <= fz_capacity - size);
    stow_status_t st = fz_sim->reserve(ctx, size, stream, out);
    fz_after_call(st, before, natural && st == STOW_ENOMEM, "reserve");
    return st;
}
static stow_status_t fz_release(void *ctx, void *ptr, size_t size)
{
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->release(ctx, ptr, size);
    fz_after_call(st, before, false, "release");
    return st;
}
static stow_status_t fz_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->mem_info(ctx, free_bytes, total_bytes);
    fz_after_call(st, before, false, "mem_info");
    return st;
}
static stow_status_t fz_synchronize(void *ctx)
{
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->synchronize(ctx);
    fz_after_call(st, before, false, "synchronize");
    if (st == STOW_OK)
        fz_streams_done((1u << FZ_STREAMS) - 1);
    return st;
}
static void fz_event_recorded(stow_event_t ev, stow_stream_t stream);
static void fz_event_waited(stow_event_t ev);
static stow_status_t fz_event_record(void *ctx, stow_stream_t stream, stow_event_t *out)
{
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->event_record(ctx, stream, out);
    fz_after_call(st, before, st == STOW_EHOSTMEM, "event_record");
    if (st == STOW_OK)
        fz_event_recorded(*out, stream);
    return st;
}
static stow_status_t fz_event_synchronize(void *ctx, stow_event_t ev)
{
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->event_synchronize(ctx, ev);
    fz_after_call(st, before, false, "event_synchronize");
    if (st == STOW_OK)
        fz_event_waited(ev);
    return st;
}
static stow_status_t fz_event_query(void *ctx, stow_event_t ev, bool *done)
{
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->event_query(ctx, ev, done);
    fz_after_call(st, before, false, "event_query");
    return st;
}
static stow_status_t fz_event_destroy(void *ctx, stow_event_t ev)
{
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->event_destroy(ctx, ev);
    fz_after_call(st, before, false, "event_destroy");
    return st;
}

/* ---- the device-work oracle ----
 * What the device would see, kept beside the pool and never read from it: a
 * logical clock; per stream, the time up to which its queued work is known
 * complete (complete_stream, a synchronize that succeeded, or a wait on an
 * event recorded there, which completes only the work before it); per freed
 * block, its range, the streams that used it with the time of their last use
 * there (the free; a scrub is a later use on its own stream) and whether a
 * scrub covered it since. On the simulated device work is pending only with
 * manual events: otherwise every event is complete when recorded and there is
 * nothing to check but the scrubs and the live blocks under an unmap. */
#define FZ_MAX_REGIONS 1024

typedef struct fz_region {
    uintptr_t lo, hi;
    uint64_t last_use[FZ_STREAMS]; /* 0: not a user */
    bool scrubbed;
} fz_region_t;

typedef struct fz_oracle {
    bool reuse_checks;  /* manual events, a backend with events: reuse must wait */
    bool unmap_checks;  /* manual events: an unmap must wait, whatever the backend */
    bool scrub_checks;  /* scrub_on_free */
    uint64_t clock;
    uint64_t done_upto[FZ_STREAMS];
    fz_region_t regions[FZ_MAX_REGIONS];
    unsigned n_regions;
    const struct fz_state *state; /* the shadow live set, for the unmap check */
    uintptr_t freeing;            /* the block a free call is freeing: live no more */
} fz_oracle_t;
static fz_oracle_t fz_or;

static const stow_stream_t fz_streams[FZ_STREAMS] = {
    NULL, (stow_stream_t)(uintptr_t)0x11, (stow_stream_t)(uintptr_t)0x22,
    (stow_stream_t)(uintptr_t)0x33};

static unsigned fz_stream_index(stow_stream_t stream)
{
    for (unsigned i = 0; i < FZ_STREAMS; i++)
        if (fz_streams[i] == stream)
            return i;
    FUZZ_CHECK(false, "the pool named a stream nobody used: %p", stream);
    return 0;
}

static void fz_streams_done(unsigned mask)
{
    fz_or.clock++;
    for (unsigned i = 0; i < FZ_STREAMS; i++)
        if (mask >> i & 1)
            fz_or.done_upto[i] = fz_or.clock;
}

/* Whether work of region r's users other than stream `except` (FZ_STREAMS:
 * none excepted) may still be queued; names the first such stream. */
static bool fz_region_busy(const fz_region_t *r, unsigned except, unsigned *who)
{
    for (unsigned u = 0; u < FZ_STREAMS; u++)
        if (u != except && r->last_use[u] && fz_or.done_upto[u] <= r->last_use[u]) {
            *who = u;
            return true;
        }
    return false;
}

/* The events the pool recorded, by handle (the simulated device's are small
 * integers): the stream and the time of each, so that a wait on one tells how
 * far its stream's work got. */
typedef struct fz_event_note {
    unsigned stream;
    uint64_t clock;
} fz_event_note_t;
static fz_event_note_t *fz_event_notes;
static size_t fz_event_note_cap;

static void fz_event_recorded(stow_event_t ev, stow_stream_t stream)
{
    size_t i = (size_t)(uintptr_t)ev;
    if (i >= fz_event_note_cap) {
        size_t cap = fz_event_note_cap ? fz_event_note_cap : 64;
        while (cap <= i)
            cap *= 2;
        fz_event_note_t *grown = realloc(fz_event_notes, cap * sizeof *grown);
        FUZZ_CHECK(grown != NULL, "host memory");
        fz_event_notes = grown;
        fz_event_note_cap = cap;
    }
    fz_or.clock++; /* after every use so far */
    fz_event_notes[i] = (fz_event_note_t){fz_stream_index(stream), fz_or.clock};
}

/* A wait on an event that succeeded: its stream's work before it is done. */
static void fz_event_waited(stow_event_t ev)
{
    size_t i = (size_t)(uintptr_t)ev;
    FUZZ_CHECK(i < fz_event_note_cap, "a wait on an event never recorded: %p", ev);
    const fz_event_note_t *n = &fz_event_notes[i];
    if (fz_or.done_upto[n->stream] < n->clock)
        fz_or.done_upto[n->stream] = n->clock;
}

static bool fz_region_settled(const fz_region_t *r)
{
    unsigned who;
    return (r->scrubbed || !fz_or.scrub_checks) && !fz_region_busy(r, FZ_STREAMS, &who);
}

static void fz_region_drop(unsigned i) { fz_or.regions[i] = fz_or.regions[--fz_or.n_regions]; }

/* A block about to be freed; false when no room is left (it goes unchecked). */
static bool fz_region_add(uintptr_t lo, uintptr_t hi, unsigned users)
{
    for (unsigned i = fz_or.n_regions; fz_or.n_regions == FZ_MAX_REGIONS && i-- > 0;)
        if (fz_region_settled(&fz_or.regions[i]))
            fz_region_drop(i);
    if (fz_or.n_regions == FZ_MAX_REGIONS)
        return false;
    fz_region_t *r = &fz_or.regions[fz_or.n_regions++];
    *r = (fz_region_t){.lo = lo, .hi = hi};
    fz_or.clock++;
    for (unsigned u = 0; u < FZ_STREAMS; u++)
        if (users >> u & 1)
            r->last_use[u] = fz_or.clock;
    return true;
}

static bool fz_overlaps(uintptr_t lo, uintptr_t hi, uintptr_t lo2, uintptr_t hi2)
{
    return lo < hi2 && lo2 < hi;
}

/* Block [lo, hi) was just handed out on stream t. */
static void fz_oracle_handed_out(uintptr_t lo, uintptr_t hi, unsigned t)
{
    for (unsigned i = fz_or.n_regions; i-- > 0;) {
        const fz_region_t *r = &fz_or.regions[i];
        if (!fz_overlaps(lo, hi, r->lo, r->hi))
            continue;
        FUZZ_CHECK(!fz_or.scrub_checks || r->scrubbed,
                   "block [%#lx,%#lx) handed out over [%#lx,%#lx), freed and never scrubbed",
                   (unsigned long)lo, (unsigned long)hi, (unsigned long)r->lo,
                   (unsigned long)r->hi);
        unsigned who;
        FUZZ_CHECK(!fz_or.reuse_checks || !fz_region_busy(r, t, &who),
                   "block [%#lx,%#lx) handed to stream %u while stream %u's queued work may "
                   "still use [%#lx,%#lx), freed there",
                   (unsigned long)lo, (unsigned long)hi, t, who, (unsigned long)r->lo,
                   (unsigned long)r->hi);
        /* The new block's own free will say all a later reuse must wait for. */
        if (lo <= r->lo && r->hi <= hi)
            fz_region_drop(i);
    }
}

static stow_status_t fz_scrub(void *ctx, void *ptr, size_t size, stow_stream_t stream)
{
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->scrub(ctx, ptr, size, stream);
    fz_after_call(st, before, false, "scrub");
    if (st != STOW_OK)
        return st;
    uintptr_t lo = (uintptr_t)ptr, hi = lo + size;
    unsigned u = fz_stream_index(stream);
    fz_or.clock++;
    for (unsigned i = 0; i < fz_or.n_regions; i++) {
        fz_region_t *r = &fz_or.regions[i];
        if (lo <= r->lo && r->hi <= hi) {
            r->scrubbed = true;
            r->last_use[u] = fz_or.clock; /* the zeroing is work queued on that stream */
        }
    }
    return st;
}

static void fz_oracle_unmapping(uintptr_t lo, uintptr_t hi);

static stow_status_t fz_unmap(void *ctx, void *va, size_t size)
{
    fz_oracle_unmapping((uintptr_t)va, (uintptr_t)va + size);
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->unmap(ctx, va, size);
    fz_after_call(st, before, false, "unmap");
    return st;
}

/* ---- the shadow model ---- */
typedef struct fz_live {
    uintptr_t ptr;
    size_t block, req;
    unsigned users; /* bit i: fz_streams[i] used it (its allocation, record_stream) */
} fz_live_t;

typedef struct fz_state {
    stow_pool_t *pool;
    fz_live_t live[FZ_MAX_LIVE];
    unsigned n_live;
    uint64_t alloc_bytes, req_bytes;
    uintptr_t freed[16]; /* recently freed pointers, for double frees */
    unsigned n_freed;
    unsigned scope_depth;
    bool accumulated_reset; /* stow_stats_reset_accumulated ran: totals restart */
    bool rounding;          /* roundup_power2_divisions set */
} fz_state_t;

/* Unmapping is not stream-ordered: no live block may be under the range,
 * and no freed one whose users' work may still be queued. */
static void fz_oracle_unmapping(uintptr_t lo, uintptr_t hi)
{
    const fz_state_t *s = fz_or.state;
    for (unsigned i = 0; s && i < s->n_live; i++)
        FUZZ_CHECK(s->live[i].ptr == fz_or.freeing ||
                       !fz_overlaps(lo, hi, s->live[i].ptr, s->live[i].ptr + s->live[i].block),
                   "unmap of [%#lx,%#lx) under live block [%#lx,+%zu)", (unsigned long)lo,
                   (unsigned long)hi, (unsigned long)s->live[i].ptr, s->live[i].block);
    for (unsigned i = 0; fz_or.unmap_checks && i < fz_or.n_regions; i++) {
        const fz_region_t *r = &fz_or.regions[i];
        unsigned who;
        FUZZ_CHECK(!fz_overlaps(lo, hi, r->lo, r->hi) || !fz_region_busy(r, FZ_STREAMS, &who),
                   "unmap of [%#lx,%#lx) while stream %u's queued work may still use "
                   "[%#lx,%#lx), freed there",
                   (unsigned long)lo, (unsigned long)hi, who, (unsigned long)r->lo,
                   (unsigned long)r->hi);
    }
}

static stow_stats_t fz_stats(fz_state_t *s)
{
    stow_stats_t st;
    FUZZ_CHECK(stow_pool_stats(s->pool, &st) == STOW_OK, "stats");
    return st;
}

/* The books agree with the shadow model and the pool's own walk passes. */
static void fz_check_books(fz_state_t *s, const char *after)
{
    stow_stats_t st = fz_stats(s);
    FUZZ_CHECK(st.allocated_bytes[STOW_POOL_ALL].current == s->alloc_bytes,
             "after %s: allocated %llu, shadow %llu", after,
             (unsigned long long)st.allocated_bytes[STOW_POOL_ALL].current,
             (unsigned long long)s->alloc_bytes);
    FUZZ_CHECK(st.requested_bytes[STOW_POOL_ALL].current == s->req_bytes,
             "after %s: requested %llu, shadow %llu", after,
             (unsigned long long)st.requested_bytes[STOW_POOL_ALL].current,
             (unsigned long long)s->req_bytes);
    FUZZ_CHECK(st.allocation[STOW_POOL_ALL].current == s->n_live,
             "after %s: allocations %llu, shadow %u", after,
             (unsigned long long)st.allocation[STOW_POOL_ALL].current, s->n_live);
    FUZZ_CHECK(st.allocated_bytes[STOW_POOL_ALL].current <= st.active_bytes[STOW_POOL_ALL].current,
             "after %s: allocated > active", after);
    FUZZ_CHECK(st.active_bytes[STOW_POOL_ALL].current <= st.reserved_bytes[STOW_POOL_ALL].current,
             "after %s: active > reserved", after);
    for (int k = 0; k < STOW_POOL_KINDS; k++) {
        FUZZ_CHECK(st.reserved_bytes[k].current <= st.reserved_bytes[k].peak, "after %s: peak", after);
        FUZZ_CHECK(s->accumulated_reset ||
                     st.allocated_bytes[k].current ==
                         st.allocated_bytes[k].allocated - st.allocated_bytes[k].freed,
                 "after %s: allocated != allocated - freed", after);
    }
    stow_sim_counters_t c;
    stow_sim_counters(fz_sim, &c);
    FUZZ_CHECK(c.reserved_bytes == st.reserved_bytes[STOW_POOL_ALL].current,
             "after %s: device holds %llu, pool reserved %llu", after,
             (unsigned long long)c.reserved_bytes,
             (unsigned long long)st.reserved_bytes[STOW_POOL_ALL].current);
    char why[256];
    FUZZ_CHECK(stow_pool_check(s->pool, why, sizeof why) == STOW_OK, "after %s: %s", after, why);
}

static int fz_find(const fz_state_t *s, uintptr_t p)
{
    for (unsigned i = 0; i < s->n_live; i++)
        if (s->live[i].ptr == p)
            return (int)i;
    return -1;
}

static size_t fz_size(fz_in_t *in)
{
    static const size_t special[] = {
        0, 1, 511, 512, 513, 8192, FZ_MIB - 1, FZ_MIB, FZ_MIB + 1, 2 * FZ_MIB, 20 * FZ_MIB,
        20 * FZ_MIB + 1, (size_t)1 << 40, (size_t)1 << 46, ((size_t)1 << 46) + 1,
        SIZE_MAX / 2, (size_t)1 << 63, SIZE_MAX - ((size_t)1 << 30) - 1,
        SIZE_MAX - ((size_t)1 << 30), SIZE_MAX - ((size_t)1 << 30) + 1, SIZE_MAX - 4096,
        SIZE_MAX - 511, SIZE_MAX - 1, SIZE_MAX};
    uint8_t mode = fz_u8(in);
    switch (mode % 8) {
    case 0: return (size_t)fz_u8(in) * 8;
    case 1: case 2: return (size_t)fz_bytes(in, 2);
    case 3: return (size_t)(fz_bytes(in, 3) % (16 * FZ_MIB));
    case 4: return (size_t)(fz_bytes(in, 4) % (640 * FZ_MIB)); /* vmm moves from 256 MiB */
    case 5: return special[fz_u8(in) % (sizeof special / sizeof special[0])];
    case 6: return (size_t)fz_bytes(in, 8);
    default: return (size_t)fz_u8(in) * 512;
    }
}

static void fz_alloc(fz_state_t *s, fz_in_t *in)
{
    size_t size = fz_size(in);
    stow_stream_t stream = fz_streams[fz_u8(in) % FZ_STREAMS];
    if (s->n_live == FZ_MAX_LIVE)
        return;
    stow_stats_t before = fz_stats(s);
    void *sentinel = (void *)(uintptr_t)0xdead0000, *p = sentinel;
    stow_status_t st = stow_pool_alloc(s->pool, size, stream, &p);
    unsigned t = fz_stream_index(stream);
    if (size == 0)
        FUZZ_CHECK(st == STOW_EINVAL, "alloc(0) returned %s", stow_strerror(st));
    if (size > SIZE_MAX - ((size_t)1 << 30))
        FUZZ_CHECK(st == STOW_EOVERFLOW, "alloc(%zu) returned %s", size, stow_strerror(st));
    if (st != STOW_OK) {
        FUZZ_CHECK(st == STOW_EINVAL || st == STOW_EOVERFLOW || st == STOW_ENOMEM ||
                     st == STOW_EBACKEND || st == STOW_EHOSTMEM,
                 "alloc(%zu): unexpected %s", size, stow_strerror(st));
        FUZZ_CHECK(p == sentinel, "alloc wrote out on error");
        stow_stats_t after = fz_stats(s);
        FUZZ_CHECK(after.allocation[STOW_POOL_ALL].allocated ==
                     before.allocation[STOW_POOL_ALL].allocated,
                 "failed alloc counted as an allocation");
        if (st == STOW_ENOMEM) {
            char msg[64];
            size_t n = stow_pool_oom_message(s->pool, msg, sizeof msg);
            FUZZ_CHECK(n > 0 && strlen(msg) < sizeof msg, "oom message");
        }
        return;
    }
    FUZZ_CHECK(p != NULL && (uintptr_t)p % 512 == 0, "alloc returned %p", p);
    size_t block = 0, req = 0;
    FUZZ_CHECK(stow_pool_block_size(s->pool, p, &block, &req) == STOW_OK, "block_size of new block");
    FUZZ_CHECK(req == size && block >= size && block % 512 == 0, "block %zu req %zu size %zu",
             block, req, size);
    uintptr_t lo = (uintptr_t)p, hi = lo + block;
    for (unsigned i = 0; i < s->n_live; i++)
        FUZZ_CHECK(hi <= s->live[i].ptr || s->live[i].ptr + s->live[i].block <= lo,
                 "new block [%#lx,%#lx) overlaps live [%#lx,+%zu)", (unsigned long)lo,
                 (unsigned long)hi, (unsigned long)s->live[i].ptr, s->live[i].block);
    fz_oracle_handed_out(lo, hi, t);
    s->live[s->n_live++] = (fz_live_t){lo, block, req, 1u << t};
    s->alloc_bytes += block;
    s->req_bytes += req;
}

/* A free the pool must reject: ENOTOWNED (EINVAL for NULL), nothing changed. */
static void fz_bad_free(fz_state_t *s, void *p)
{
    stow_stats_t before = fz_stats(s);
    stow_status_t st = stow_pool_free(s->pool, p);
    FUZZ_CHECK(st == (p ? STOW_ENOTOWNED : STOW_EINVAL), "bad free of %p returned %s", p,
             stow_strerror(st));
    stow_stats_t after = fz_stats(s);
    FUZZ_CHECK(memcmp(before.allocated_bytes, after.allocated_bytes, sizeof before.allocated_bytes) ==
                     0 &&
                 memcmp(before.active_bytes, after.active_bytes, sizeof before.active_bytes) == 0 &&
                 memcmp(before.reserved_bytes, after.reserved_bytes,
                        sizeof before.reserved_bytes) == 0,
             "a rejected free changed the books");
    if (p)
        FUZZ_CHECK(after.num_invalid_frees == before.num_invalid_frees + 1, "num_invalid_frees");
}

static void fz_free(fz_state_t *s, fz_in_t *in)
{
    uint8_t how = fz_u8(in), pick = fz_u8(in);
    switch (how % 8) {
    default: { /* a live block */
        if (!s->n_live)
            return;
        unsigned i = pick % s->n_live;
        fz_live_t b = s->live[i];
        /* Its range is freed as the call runs (a scrub, an unmap may follow). */
        bool added = fz_region_add(b.ptr, b.ptr + b.block, b.users);
        fz_or.freeing = b.ptr;
        stow_status_t st = stow_pool_free(s->pool, (void *)b.ptr);
        fz_or.freeing = 0;
        if (st != STOW_OK) {
            if (added)
                fz_or.n_regions--; /* nothing was freed */
            /* Only a backend failure may refuse a valid free, and then nothing changed. */
            FUZZ_CHECK(st == STOW_EBACKEND || st == STOW_EHOSTMEM, "free returned %s",
                     stow_strerror(st));
            FUZZ_CHECK(stow_pool_block_size(s->pool, (void *)b.ptr, NULL, NULL) == STOW_OK,
                     "a failed free released the block");
            return;
        }
        s->live[i] = s->live[--s->n_live];
        s->alloc_bytes -= b.block;
        s->req_bytes -= b.req;
        s->freed[s->n_freed++ % 16] = b.ptr;
        return;
    }
    case 0: { /* interior pointer */
        if (!s->n_live)
            return;
        fz_live_t b = s->live[pick % s->n_live];
        size_t off = 1 + (size_t)fz_bytes(in, 3) % (b.block - 1);
        fz_bad_free(s, (void *)(b.ptr + off));
        return;
    }
    case 1: { /* double free (unless the address was handed out again) */
        if (!s->n_freed)
            return;
        uintptr_t p = s->freed[pick % (s->n_freed < 16 ? s->n_freed : 16)];
        if (fz_find(s, p) < 0)
            fz_bad_free(s, (void *)p);
        return;
    }
    case 2: { /* foreign pointer */
        uintptr_t p = (uintptr_t)fz_bytes(in, 8);
        if (p && fz_find(s, p) < 0)
            fz_bad_free(s, (void *)p);
        return;
    }
    case 3: fz_bad_free(s, NULL); return;
    }
}

static void fz_inject(fz_in_t *in)
{
    static const stow_sim_call_t kinds[] = {
        STOW_SIM_RESERVE,      STOW_SIM_RELEASE,     STOW_SIM_MEM_INFO,
        STOW_SIM_SYNCHRONIZE,  STOW_SIM_EVENT_RECORD, STOW_SIM_EVENT_QUERY,
        STOW_SIM_EVENT_DESTROY, STOW_SIM_VA_RESERVE,  STOW_SIM_PHYS_CREATE,
        STOW_SIM_MAP,          STOW_SIM_UNMAP,       STOW_SIM_PHYS_RELEASE,
        STOW_SIM_SCRUB};
    static const stow_status_t statuses[] = {STOW_OK, STOW_ENOMEM, STOW_EBACKEND, STOW_EHOSTMEM};
    uint8_t how = fz_u8(in);
    stow_sim_call_t kind = kinds[fz_u8(in) % (sizeof kinds / sizeof kinds[0])];
    /* The device's two waits fail alike: a synchronize's faults are a wait on
     * one event's too (each kind keeps its own call count for fail_nth).
     * Every input decodes into the same calls as before waits on events
     * existed, and one that made a remap's synchronize fail now makes its
     * event wait fail first, then the synchronize it falls back to. */
    stow_sim_call_t kinds_hit[2] = {kind, STOW_SIM_EVENT_SYNCHRONIZE};
    unsigned n_hit = kind == STOW_SIM_SYNCHRONIZE ? 2 : 1;
    if (how % 4 == 0) {
        /* The seed first, then the rate, as the corpus replay (gcc) has
         * always read them. As two arguments of one call their order was
         * unspecified: clang, which builds the fuzzer, read the rate first,
         * so the fuzzer and the replay decoded the same input into other
         * faults (on the corpus 46,248 injected against 6,272), and the
         * named regression inputs, found by the replay, reproduce under this
         * order alone. */
        uint64_t seed = fz_bytes(in, 4);
        uint32_t one_in = 1u + fz_u8(in) % 8;
        for (unsigned i = 0; i < n_hit; i++)
            stow_sim_fail_random(fz_sim, kinds_hit[i], one_in, seed);
    } else if (how % 4 == 1) {
        for (unsigned i = 0; i < n_hit; i++)
            stow_sim_fail_random(fz_sim, kinds_hit[i], 0, 0);
    } else {
        uint64_t nth = fz_u8(in) % 8;
        for (unsigned i = 0; i < n_hit; i++)
            stow_sim_fail_nth(fz_sim, kinds_hit[i], nth, statuses[(how >> 2) % 4]);
    }
}

static void fz_scope(fz_state_t *s, fz_in_t *in)
{
    if (fz_u8(in) % 2) {
        unsigned depth = 0;
        stow_status_t st = stow_scope_push(s->pool, &depth);
        if (s->scope_depth == STOW_SCOPE_MAX_DEPTH) {
            FUZZ_CHECK(st == STOW_EBUSY, "push at max depth returned %s", stow_strerror(st));
        } else {
            FUZZ_CHECK(st == STOW_OK && depth == s->scope_depth + 1, "push: %s depth %u",
                     stow_strerror(st), depth);
            s->scope_depth++;
        }
    } else {
        stow_scope_result_t r;
        stow_status_t st = stow_scope_pop(s->pool, &r);
        if (!s->scope_depth) {
            FUZZ_CHECK(st == STOW_EINVAL, "pop with no scope returned %s", stow_strerror(st));
        } else {
            FUZZ_CHECK(st == STOW_OK, "pop: %s", stow_strerror(st));
            s->scope_depth--;
            FUZZ_CHECK(r.allocated_bytes_peak >= r.allocated_bytes_at_push &&
                         r.allocated_bytes_peak >= r.allocated_bytes_at_pop &&
                         r.reserved_bytes_peak >= r.reserved_bytes_at_push &&
                         r.reserved_bytes_peak >= r.reserved_bytes_at_pop,
                     "scope peaks below their ends");
            FUZZ_CHECK(r.allocated_bytes_at_pop == s->alloc_bytes, "scope at_pop");
        }
    }
}

/* set_memory_fraction as PyTorch calls it at run time: (0, 1] only, never a
 * limit below one granule, and memory already reserved is kept. */
static void fz_memory_fraction(fz_state_t *s, double fraction)
{
    stow_stats_t before = fz_stats(s);
    stow_status_t st = stow_pool_set_memory_fraction(s->pool, fraction);
    stow_stats_t after = fz_stats(s);
    stow_config_t cfg;
    stow_pool_config(s->pool, &cfg);
    if (!(fraction > 0.0 && fraction <= 1.0))
        FUZZ_CHECK(st == STOW_EINVAL, "memory fraction %g accepted", fraction);
    FUZZ_CHECK(st == STOW_OK || st == STOW_EINVAL, "set_memory_fraction: %s", stow_strerror(st));
    if (st == STOW_OK)
        FUZZ_CHECK(cfg.memory_fraction == fraction && after.limit_bytes >= 2 * FZ_MIB,
                   "fraction %g: limit %llu", fraction, (unsigned long long)after.limit_bytes);
    else
        FUZZ_CHECK(after.limit_bytes == before.limit_bytes, "a refused fraction moved the limit");
    FUZZ_CHECK(after.reserved_bytes[STOW_POOL_ALL].current ==
                   before.reserved_bytes[STOW_POOL_ALL].current,
               "a new limit released or reserved memory by itself");
}

static void fz_report(void)
{
    fprintf(stderr, "fuzz_api totals: inputs=%llu api_ops=%llu injected_faults=%llu "
                    "event_waits=%llu (failed %llu)\n",
            fz_totals.inputs, fz_totals.ops, fz_totals.injected_faults, fz_totals.event_waits,
            fz_totals.event_wait_failures);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_verbose = getenv("FUZZ_API_VERBOSE") != NULL;
    atexit(fz_report);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in_t in = {data, data + size};
    static const size_t capacities[] = {0, 64 * FZ_MIB, 256 * FZ_MIB, 1024 * FZ_MIB};
    uint8_t setup = fz_u8(&in), conf = fz_u8(&in);
    fz_totals.inputs++;
    fz_injected = 0;

    stow_sim_config_t sc;
    stow_sim_config_default(&sc);
    sc.capacity_bytes = capacities[setup % 4];
    sc.manual_events = (setup >> 2) & 1;
    FUZZ_CHECK(stow_sim_create(&sc, &fz_sim) == STOW_OK, "sim create");
    fz_capacity = sc.capacity_bytes ? sc.capacity_bytes : (size_t)1 << 46;
    fz_backend = *fz_sim;
    fz_backend.reserve = fz_reserve;
    fz_backend.release = fz_release;
    fz_backend.mem_info = fz_mem_info;
    fz_backend.synchronize = fz_synchronize;
    fz_backend.event_record = fz_event_record;
    fz_backend.event_query = fz_event_query;
    fz_backend.event_destroy = fz_event_destroy;
    fz_backend.event_synchronize = fz_event_synchronize;
    fz_backend.scrub = fz_scrub;
    fz_backend.unmap = fz_unmap;
    memset(&fz_or, 0, sizeof fz_or);
    fz_or.unmap_checks = sc.manual_events;
    fz_or.reuse_checks = sc.manual_events && !((setup >> 6) & 1);
    fz_or.scrub_checks = (setup >> 7) & 1;
    if ((setup >> 6) & 1) { /* a single-stream backend: every stream shares one order */
        fz_backend.event_record = NULL;
        fz_backend.event_query = NULL;
        fz_backend.event_destroy = NULL;
    }

    stow_config_t cfg;
    stow_config_default(&cfg);
    if (conf & 1)
        cfg.max_split_size_bytes = (20 + (size_t)fz_u8(&in)) * FZ_MIB;
    if (conf & 2)
        for (int i = 0; i < STOW_ROUNDUP_INTERVALS; i++)
            cfg.roundup_power2_divisions[i] = 1u << (fz_u8(&in) % 5);
    if (conf & 4)
        cfg.garbage_collection_threshold = 0.5 + (fz_u8(&in) % 40) / 100.0;
    if (conf & 8)
        cfg.memory_fraction = (1 + fz_u8(&in) % 100) / 100.0;
    cfg.release_idle_on_grow = !(conf & 16);
    cfg.reuse_other_streams_on_miss = (setup >> 4) & 1;
    cfg.scrub_on_free = (setup >> 7) & 1; /* a refused scrub keeps its block out of reach */
    if (conf & 128) { /* quick lists and mid ring: off, or short enough to fill and flush often */
        cfg.quick_depth = fz_u8(&in) % 9;
        cfg.quick_mid_slots = fz_u8(&in) % (STOW_QUICK_MID_SLOTS_MAX + 1);
    }
    if (conf & 64) { /* page-mapped segments: granules, remapping, placement */
        cfg.policy = STOW_POLICY_VMM;
        /* (release_idle_on_grow, bit 16, is the classic pool's alone.) A remap
         * synchronizes instead of waiting on events. */
        if (conf & 16)
            fz_backend.event_synchronize = NULL;
        if ((setup >> 5) & 1) /* one range for every request, no quick lists */
            cfg.vmm_small_kb = 0;
        /* Learning the step (vmm_step.c): two bits that mean other things
         * too, so that it meets each of them both ways. Random sequences
         * rarely repeat long enough to be planned; the log, the signatures
         * and empty_cache's forgetting run all the same. */
        cfg.vmm_learn_step = ((conf >> 3) ^ (setup >> 3)) & 1;
        /* At most 1 GiB: the "unlimited" 64 TiB device would let one request
         * map 32 M granules, which only measures the simulator's patience. */
        if (!sc.capacity_bytes) {
            fz_capacity = capacities[1 + setup % 3];
            stow_sim_set_capacity(fz_sim, fz_capacity);
        }
    }
    if (conf & 32) /* mem_info fails at creation */
        stow_sim_fail_nth(fz_sim, STOW_SIM_MEM_INFO, 1, STOW_EBACKEND);

    fz_state_t *s = calloc(1, sizeof *s);
    FUZZ_CHECK(s != NULL, "host memory");
    s->rounding = (conf & 2) != 0;
    fz_or.state = s;
    stow_status_t st = stow_pool_create(&cfg, &fz_backend, &s->pool);
    if (st != STOW_OK) {
        /* A memory fraction leaving less than one 2 MiB granule is refused. */
        double limit = cfg.memory_fraction >= 1.0 ? (double)fz_capacity
                                                  : cfg.memory_fraction * (double)fz_capacity;
        FUZZ_CHECK((st == STOW_EBACKEND && (conf & 32)) ||
                     (st == STOW_EINVAL && (size_t)limit < 2 * FZ_MIB),
                 "create returned %s", stow_strerror(st));
        fz_totals.injected_faults += fz_injected;
        stow_sim_counters_t c;
        stow_sim_counters(fz_sim, &c);
        FUZZ_CHECK(c.reserved_bytes == 0, "failed create reserved memory");
        FUZZ_CHECK(stow_sim_destroy(fz_sim) == STOW_OK, "sim destroy");
        free(s);
        return 0;
    }
    stow_sim_fail_nth(fz_sim, STOW_SIM_MEM_INFO, 0, STOW_OK);

    for (unsigned op = 0; op < FZ_MAX_OPS && in.p < in.end; op++) {
        uint8_t code = fz_u8(&in);
        const char *what = "?";
        switch (code % 16) {
        case 0: case 1: case 2: case 3: what = "alloc"; fz_alloc(s, &in); break;
        case 4: case 5: case 6: what = "free"; fz_free(s, &in); break;
        case 7: {
            what = "record_stream";
            uint8_t pick = fz_u8(&in);
            stow_stream_t stream = fz_streams[fz_u8(&in) % FZ_STREAMS];
            if (s->n_live) {
                fz_live_t *b = &s->live[pick % s->n_live];
                st = stow_record_stream(s->pool, (void *)b->ptr, stream);
                FUZZ_CHECK(st == STOW_OK || st == STOW_EHOSTMEM, "record_stream: %s",
                         stow_strerror(st));
                if (st == STOW_OK)
                    b->users |= 1u << fz_stream_index(stream);
            } else {
                FUZZ_CHECK(stow_record_stream(s->pool, (void *)(uintptr_t)0x1000, stream) ==
                             STOW_ENOTOWNED,
                         "record_stream of a foreign pointer");
            }
            break;
        }
        case 8:
            what = "empty_cache";
            st = stow_empty_cache(s->pool);
            FUZZ_CHECK(st == STOW_OK || st == STOW_EBACKEND, "empty_cache: %s", stow_strerror(st));
            break;
        case 9: {
            what = "stats";
            stow_stats_t snap = fz_stats(s);
            char buf[256];
            size_t need = (fz_u8(&in) % 2) ? stow_stats_json(&snap, buf, sizeof buf)
                                           : stow_stats_summary(&snap, buf, sizeof buf);
            FUZZ_CHECK(need > 0 && strlen(buf) < sizeof buf, "summary/json truncation");
            break;
        }
        case 10:
            what = "reset";
            if (fz_u8(&in) % 2)
                stow_stats_reset_peak(s->pool);
            else {
                stow_stats_reset_accumulated(s->pool);
                s->accumulated_reset = true;
            }
            break;
        case 11: what = "scope"; fz_scope(s, &in); break;
        case 12: {
            what = "complete_stream";
            unsigned i = fz_u8(&in) % FZ_STREAMS;
            stow_sim_complete_stream(fz_sim, fz_streams[i]);
            fz_streams_done(1u << i);
            break;
        }
        case 13: what = "inject"; fz_inject(&in); break;
        case 14: {
            uint8_t b = fz_u8(&in);
            if (b >= 240) { /* the last sixteen values: the pool's limit instead */
                what = "memory_fraction";
                fz_memory_fraction(s, fz_u8(&in) / 200.0);
                break;
            }
            what = "capacity";
            size_t cap = (size_t)(1 + b) * 4 * FZ_MIB;
            stow_sim_set_capacity(fz_sim, cap);
            fz_capacity = cap;
            break;
        }
        default: {
            what = "block_size";
            uintptr_t p = (uintptr_t)fz_bytes(&in, 8);
            size_t b = 0;
            st = stow_pool_block_size(s->pool, (void *)p, &b, NULL);
            int i = fz_find(s, p);
            FUZZ_CHECK((st == STOW_OK) == (i >= 0), "block_size of %#lx: %s", (unsigned long)p,
                     stow_strerror(st));
            break;
        }
        }
        fz_totals.ops++;
        if (fz_verbose) {
            stow_stats_t v = fz_stats(s);
            fprintf(stderr, "op %u: %s -> live %u, allocated %llu, reserved %llu\n", op, what,
                    s->n_live, (unsigned long long)v.allocated_bytes[STOW_POOL_ALL].current,
                    (unsigned long long)v.reserved_bytes[STOW_POOL_ALL].current);
        }
        fz_check_books(s, what);
    }

    /* Tear down: no more faults, everything freed, nothing left on the device. */
    for (int k = 0; k < STOW_SIM_CALL_KINDS; k++) {
        stow_sim_fail_nth(fz_sim, (stow_sim_call_t)k, 0, STOW_OK);
        stow_sim_fail_random(fz_sim, (stow_sim_call_t)k, 0, 0);
    }
    bool complete = !(setup & 8);
    if (complete)
        for (int i = 0; i < FZ_STREAMS; i++) {
            stow_sim_complete_stream(fz_sim, fz_streams[i]);
            fz_streams_done(1u << i);
        }
    while (s->scope_depth) {
        stow_scope_result_t r;
        FUZZ_CHECK(stow_scope_pop(s->pool, &r) == STOW_OK, "final pop");
        s->scope_depth--;
    }
    while (s->n_live) {
        fz_live_t b = s->live[s->n_live - 1];
        (void)fz_region_add(b.ptr, b.ptr + b.block, b.users);
        fz_or.freeing = b.ptr;
        st = stow_pool_free(s->pool, (void *)b.ptr);
        fz_or.freeing = 0;
        s->n_live--;
        FUZZ_CHECK(st == STOW_OK, "final free: %s", stow_strerror(st));
        s->alloc_bytes -= b.block;
        s->req_bytes -= b.req;
    }
    fz_check_books(s, "final frees");
    st = stow_pool_destroy(s->pool);
    FUZZ_CHECK(st == STOW_OK, "destroy: %s", stow_strerror(st));
    stow_sim_counters_t c;
    stow_sim_counters(fz_sim, &c);
    FUZZ_CHECK(c.reserved_bytes == 0 && c.live_reservations == 0,
             "device still holds %llu bytes in %llu reservations after destroy",
             (unsigned long long)c.reserved_bytes, (unsigned long long)c.live_reservations);
    FUZZ_CHECK(stow_sim_destroy(fz_sim) == STOW_OK, "sim destroy");
    fz_totals.injected_faults += fz_injected;
    fz_totals.event_waits += c.calls[STOW_SIM_EVENT_SYNCHRONIZE];
    fz_totals.event_wait_failures += c.failures[STOW_SIM_EVENT_SYNCHRONIZE];
    free(s);
    return 0;
}
