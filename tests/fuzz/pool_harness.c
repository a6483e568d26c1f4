/*
 * tests/fuzz/pool_harness.c: the harness the pool fuzzers share (pool_harness.h):
 * the wrapper backend, the device-work oracle, the shadow model and the checked
 * calls. Built into fuzz_api and fuzz_step (CMakeLists.txt, STOW_FUZZ_EXTRA_*).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/pool_harness.h"

uint64_t fz_bytes(fz_in_t *in, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | (in->p < in->end ? *in->p++ : 0);
    return v;
}
uint8_t fz_u8(fz_in_t *in) { return (uint8_t)fz_bytes(in, 1); }

/* ---- the wrapper backend ---- */
stow_backend_t *fz_sim;       /* the simulated device */
stow_backend_t fz_backend;    /* what the pool sees */
size_t fz_capacity;           /* current device capacity (bytes) */
uint64_t fz_injected;         /* faults injected in this input */

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
static void fz_released(uintptr_t lo, uintptr_t hi);
static stow_status_t fz_release(void *ctx, void *ptr, size_t size)
{
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->release(ctx, ptr, size);
    fz_after_call(st, before, false, "release");
    if (st == STOW_OK)
        fz_released((uintptr_t)ptr, (uintptr_t)ptr + size);
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
fz_oracle_t fz_or;

const stow_stream_t fz_streams[FZ_STREAMS] = {
    NULL, (stow_stream_t)(uintptr_t)0x11, (stow_stream_t)(uintptr_t)0x22,
    (stow_stream_t)(uintptr_t)0x33};

unsigned fz_stream_index(stow_stream_t stream)
{
    for (unsigned i = 0; i < FZ_STREAMS; i++)
        if (fz_streams[i] == stream)
            return i;
    FUZZ_CHECK(false, "the pool named a stream nobody used: %p", stream);
    return 0;
}

void fz_streams_done(unsigned mask)
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

/* A release waits for the work queued on the memory (the backend's
 * contract): the blocks freed in [lo, hi) have no user left, and a
 * host-backed device may hand out the same addresses again. */
static void fz_released(uintptr_t lo, uintptr_t hi)
{
    for (unsigned i = fz_or.n_regions; i-- > 0;)
        if (lo <= fz_or.regions[i].lo && fz_or.regions[i].hi <= hi)
            fz_region_drop(i);
}

bool fz_region_add(uintptr_t lo, uintptr_t hi, unsigned users)
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

uint64_t fz_handle_maps;

static stow_status_t fz_map(void *ctx, void *va, size_t size, stow_phys_t h)
{
    if (size > fz_sim->granularity_bytes)
        fz_handle_maps++;
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->map(ctx, va, size, h);
    fz_after_call(st, before, false, "map");
    return st;
}

static stow_status_t fz_unmap(void *ctx, void *va, size_t size)
{
    fz_oracle_unmapping((uintptr_t)va, (uintptr_t)va + size);
    uint64_t before = fz_failures();
    stow_status_t st = fz_sim->unmap(ctx, va, size);
    fz_after_call(st, before, false, "unmap");
    return st;
}

/* ---- block contents ----
 * Each block's pattern is queued as work on its stream (stow_sim_launch), so
 * that it runs in the block's stream order as the device would run a kernel
 * using it: with manual events, late, when the stream completes or the pool
 * waits on it. On a backend without events every stream shares one order, so
 * the work goes on one stream. A word's value names its block's tag and its
 * offset, so a wrong word says whose it is. */
#define FZ_PATTERN_KEY 0x9E3779B97F4A7C15ull
#define FZ_STRIPE_BYTES 64
#define FZ_WHOLE_BYTES 4096
#define FZ_BOUNDARIES_MAX 512

uint64_t fz_words_written, fz_words_checked;
static uint32_t fz_tag_next;
static bool fz_single_stream, fz_contents;

enum { FZ_FILL, FZ_ZERO_THEN_FILL, FZ_CHECK };
typedef struct fz_content {
    uintptr_t ptr;
    size_t block;
    uint32_t tag;
    int kind;
    int pass; /* FZ_FILL or FZ_CHECK or zero: what fz_stripe does now */
} fz_content_t;

static uint64_t fz_word(uint32_t tag, size_t off)
{
    return (((uint64_t)tag << 32) | (uint32_t)(off / 8)) ^ FZ_PATTERN_KEY;
}

/* The pass over the words of [off, off + len) of the block, clipped to it. */
static void fz_stripe(fz_content_t *c, size_t off, size_t len)
{
    if (off >= c->block)
        return;
    if (len > c->block - off)
        len = c->block - off;
    uint64_t *w = (uint64_t *)(c->ptr + off);
    for (size_t k = 0; k < len / 8; k++) {
        size_t o = off + 8 * k;
        uint64_t want = c->pass == FZ_ZERO_THEN_FILL ? 0 : fz_word(c->tag, o);
        if (c->pass == FZ_FILL) {
            w[k] = want;
            fz_words_written++;
            continue;
        }
        uint64_t v = w[k];
        fz_words_checked++;
        if (v == want)
            continue;
        uint64_t g = v ^ FZ_PATTERN_KEY;
        FUZZ_CHECK(false,
                   "block [%#lx,+%zu) (tag %u): offset %zu holds %#llx, not %#llx (%s; as a "
                   "pattern: tag %u, offset %llu)",
                   (unsigned long)c->ptr, c->block, c->tag, o, (unsigned long long)v,
                   (unsigned long long)want,
                   c->pass == FZ_ZERO_THEN_FILL ? "scrub_on_free: not zeroed before reuse"
                                                : "its pattern, written after its allocation",
                   (unsigned)(g >> 32), (unsigned long long)(8 * (g & 0xffffffffu)));
    }
}

/* One pass over the block's stripes: all of a small block; the ends of a
 * larger one and both sides of each granule boundary in it. */
static void fz_content_pass(fz_content_t *c)
{
    if (c->block <= FZ_WHOLE_BYTES) {
        fz_stripe(c, 0, c->block);
        return;
    }
    fz_stripe(c, 0, FZ_STRIPE_BYTES);
    fz_stripe(c, c->block - FZ_STRIPE_BYTES, FZ_STRIPE_BYTES);
    size_t g = fz_sim->granularity_bytes;
    uintptr_t first = (c->ptr + g) & ~(uintptr_t)(g - 1), end = c->ptr + c->block;
    if (first >= end)
        return;
    size_t n = (end - 1 - first) / g + 1, step = n > FZ_BOUNDARIES_MAX ? n / FZ_BOUNDARIES_MAX : 1;
    for (size_t j = 0; j < n; j += step) {
        size_t at = first + j * g - c->ptr;
        fz_stripe(c, at - FZ_STRIPE_BYTES, 2 * FZ_STRIPE_BYTES);
    }
}

static void fz_content_run(void *arg)
{
    fz_content_t *c = arg;
    if (c->kind == FZ_ZERO_THEN_FILL) {
        c->pass = FZ_ZERO_THEN_FILL;
        fz_content_pass(c);
    }
    c->pass = c->kind == FZ_CHECK ? FZ_CHECK : FZ_FILL;
    fz_content_pass(c);
    free(c);
}

static void fz_content_queue(const fz_live_t *b, int kind)
{
    if (!fz_contents)
        return;
    fz_content_t *c = malloc(sizeof *c);
    FUZZ_CHECK(c != NULL, "host memory");
    *c = (fz_content_t){b->ptr, b->block, b->tag, kind, 0};
    stow_stream_t stream = fz_streams[fz_single_stream ? 0 : b->stream];
    FUZZ_CHECK(stow_sim_launch(fz_sim, stream, fz_content_run, c) == STOW_OK, "launch");
}

/* ---- the shadow model ---- */
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

stow_stats_t fz_stats(fz_state_t *s)
{
    stow_stats_t st;
    FUZZ_CHECK(stow_pool_stats(s->pool, &st) == STOW_OK, "stats");
    return st;
}

void fz_check_counts(fz_state_t *s, const char *after)
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
}

void fz_check_books(fz_state_t *s, const char *after)
{
    fz_check_counts(s, after);
    char why[256];
    FUZZ_CHECK(stow_pool_check(s->pool, why, sizeof why) == STOW_OK, "after %s: %s", after, why);
}

int fz_find(const fz_state_t *s, uintptr_t p)
{
    for (unsigned i = 0; i < s->n_live; i++)
        if (s->live[i].ptr == p)
            return (int)i;
    return -1;
}

int fz_alloc_sized(fz_state_t *s, size_t size, stow_stream_t stream)
{
    if (s->n_live == FZ_MAX_LIVE)
        return -1;
    stow_stats_t before = fz_stats(s);
    void *sentinel = (void *)(uintptr_t)0xdead0000, *p = sentinel;
    stow_status_t st = stow_pool_alloc(s->pool, size, stream, &p);
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
        return -1;
    }
    return fz_track_new(s, p, size, stream);
}

int fz_track_new(fz_state_t *s, void *p, size_t size, stow_stream_t stream)
{
    unsigned t = fz_stream_index(stream);
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
    s->live[s->n_live] = (fz_live_t){lo, block, req, 1u << t, t, ++fz_tag_next};
    fz_content_queue(&s->live[s->n_live], fz_or.scrub_checks ? FZ_ZERO_THEN_FILL : FZ_FILL);
    s->alloc_bytes += block;
    s->req_bytes += req;
    return (int)s->n_live++;
}

int fz_alloc_at(fz_state_t *s, uintptr_t at, size_t size, stow_stream_t stream)
{
    if (s->n_live == FZ_MAX_LIVE)
        return -1;
    stow_stats_t before = fz_stats(s);
    stow_config_t cfg;
    stow_pool_config(s->pool, &cfg);
    bool vmm = cfg.policy == STOW_POLICY_VMM;
    stow_status_t st = stow_pool_alloc_at(s->pool, (void *)at, size, stream);
    if (st != STOW_OK) {
        FUZZ_CHECK(st == STOW_EINVAL || st == STOW_EOVERFLOW || st == STOW_ENOTOWNED ||
                       st == STOW_ENOSYS || st == STOW_EHOSTMEM,
                   "alloc_at(%#lx, %zu): unexpected %s", (unsigned long)at, size,
                   stow_strerror(st));
        FUZZ_CHECK(st != STOW_ENOSYS || vmm, "alloc_at refused by a classic pool");
        stow_stats_t after = fz_stats(s);
        FUZZ_CHECK(memcmp(before.allocated_bytes, after.allocated_bytes,
                          sizeof before.allocated_bytes) == 0 &&
                       memcmp(before.reserved_bytes, after.reserved_bytes,
                              sizeof before.reserved_bytes) == 0,
                   "a refused alloc_at changed the books");
        return -1;
    }
    FUZZ_CHECK(!vmm, "a page-mapped pool took alloc_at");
    return fz_track_new(s, (void *)at, size, stream);
}

void fz_bad_free(fz_state_t *s, void *p)
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

bool fz_free_live(fz_state_t *s, unsigned i)
{
    fz_live_t b = s->live[i];
    fz_content_queue(&b, FZ_CHECK);
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
        return false;
    }
    s->live[i] = s->live[--s->n_live];
    s->alloc_bytes -= b.block;
    s->req_bytes -= b.req;
    s->freed[s->n_freed++ % 16] = b.ptr;
    return true;
}

void fz_inject(fz_in_t *in)
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

/* set_memory_fraction as PyTorch calls it at run time: (0, 1] only, never a
 * limit below one granule, and memory already reserved is kept. */
void fz_memory_fraction(fz_state_t *s, double fraction)
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

void fz_device_open(uint8_t setup, const size_t capacities[4], bool contents)
{
    stow_sim_config_t config;
    stow_sim_config_default(&config);
    config.capacity_bytes = capacities[setup % 4];
    config.manual_events = (setup >> 2) & 1;
    config.host_backed = contents;
    const stow_sim_config_t *sc = &config;
    bool single_stream = (setup >> 6) & 1, scrub_checks = (setup >> 7) & 1;
    fz_single_stream = single_stream;
    fz_contents = contents;
    FUZZ_CHECK(stow_sim_create(sc, &fz_sim) == STOW_OK, "sim create");
    fz_injected = 0;
    fz_capacity = sc->capacity_bytes ? sc->capacity_bytes : (size_t)1 << 46;
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
    fz_backend.map = fz_map;
    fz_backend.unmap = fz_unmap;
    memset(&fz_or, 0, sizeof fz_or);
    fz_or.unmap_checks = sc->manual_events;
    fz_or.reuse_checks = sc->manual_events && !single_stream;
    fz_or.scrub_checks = scrub_checks;
    if (single_stream) { /* a single-stream backend: every stream shares one order */
        fz_backend.event_record = NULL;
        fz_backend.event_query = NULL;
        fz_backend.event_destroy = NULL;
    }
}

stow_sim_counters_t fz_teardown(fz_state_t *s, bool complete)
{
    for (int k = 0; k < STOW_SIM_CALL_KINDS; k++) {
        stow_sim_fail_nth(fz_sim, (stow_sim_call_t)k, 0, STOW_OK);
        stow_sim_fail_random(fz_sim, (stow_sim_call_t)k, 0, 0);
    }
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
        fz_content_queue(&b, FZ_CHECK);
        (void)fz_region_add(b.ptr, b.ptr + b.block, b.users);
        fz_or.freeing = b.ptr;
        stow_status_t st = stow_pool_free(s->pool, (void *)b.ptr);
        fz_or.freeing = 0;
        s->n_live--;
        FUZZ_CHECK(st == STOW_OK, "final free: %s", stow_strerror(st));
        s->alloc_bytes -= b.block;
        s->req_bytes -= b.req;
    }
    fz_check_books(s, "final frees");
    stow_status_t st = stow_pool_destroy(s->pool);
    FUZZ_CHECK(st == STOW_OK, "destroy: %s", stow_strerror(st));
    s->pool = NULL;
    stow_sim_counters_t c;
    stow_sim_counters(fz_sim, &c);
    FUZZ_CHECK(c.reserved_bytes == 0 && c.live_reservations == 0,
             "device still holds %llu bytes in %llu reservations after destroy",
             (unsigned long long)c.reserved_bytes, (unsigned long long)c.live_reservations);
    /* The pool waited for the device before it gave the memory back (a
     * release waits for queued work, a page-mapped pool synchronizes): no
     * check on its blocks is left to run. */
    FUZZ_CHECK(c.queued_work == 0, "%llu pieces of work still queued after destroy",
               (unsigned long long)c.queued_work);
    FUZZ_CHECK(stow_sim_destroy(fz_sim) == STOW_OK, "sim destroy");
    fz_sim = NULL;
    return c;
}
