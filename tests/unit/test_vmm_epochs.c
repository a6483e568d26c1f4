/*
 * tests/unit/test_vmm_epochs.c: stream safety of unmaps in a page-mapped pool
 * (policy vmm) at the edges test_vmm.c does not reach: the ring of at most
 * STOW_VMM_CLOSURES (8) closed unmap epochs in flight (allocator/vmm_epochs.c)
 * and the synchronize a failed backing makes before it gives created handles
 * back (give_back_created, allocator/vmm.c).
 *
 * Every pool here sits on a simulated device with manual events (work stays
 * queued until a test completes its stream) behind a thin wrapper, the work
 * oracle below, which fails the test when the pool unmaps a granule that work
 * queued before a free may still use. The books alone cannot show that.
 * A handle per granule (vmm_handle_mb:2), as in test_vmm.c; test_vmm_handles.c
 * runs the same oracle over handles of several granules.
 */
#include <criterion/criterion.h>
#include <stdio.h>

#include "test_support.h"

#define MIB ((size_t)1 << 20)
#define G (2 * MIB)         /* the simulated device's granule */
#define CLOSURES 8          /* STOW_VMM_CLOSURES: closed epochs in flight at most */
#define FREES_PER_CLOSURE 8 /* CLOSE_EVERY_FREES in vmm_epochs.c */

static stow_backend_t *sim;
static stow_pool_t *pool;

/* ---- the work oracle ----
 * A logical clock; per stream, the time up to which its queued work is known
 * complete (a test completed the stream, the device synchronized, or the pool
 * waited on an event recorded there); per freed block, its range, stream and
 * the time of its free. An unmap overlapping a block whose stream is not known
 * complete past its free is a violation. Violations are counted, not asserted
 * in the callback, which runs under the pool lock. */
#define ORACLE_STREAMS 4
#define ORACLE_FREES 512
#define ORACLE_EVENTS 1024

typedef struct freed_range {
    uintptr_t lo, hi;
    unsigned stream;
    uint64_t freed_at;
} freed_range_t;

typedef struct event_note {
    unsigned stream;
    uint64_t recorded_at;
} event_note_t;

static struct {
    stow_backend_t watched; /* what the pool sees: the sim with four methods wrapped */
    uint64_t clock;
    stow_stream_t streams[ORACLE_STREAMS];
    unsigned stream_count;
    uint64_t done_upto[ORACLE_STREAMS];
    freed_range_t frees[ORACLE_FREES];
    unsigned free_count;
    event_note_t events[ORACLE_EVENTS]; /* by the sim's event handle (a small index) */
    uint64_t violations;
    char first_violation[160];
} oracle;

static unsigned stream_index(stow_stream_t stream)
{
    for (unsigned i = 0; i < oracle.stream_count; i++)
        if (oracle.streams[i] == stream)
            return i;
    cr_assert_lt(oracle.stream_count, ORACLE_STREAMS, "too many streams for the oracle");
    oracle.streams[oracle.stream_count] = stream;
    return oracle.stream_count++;
}

static stow_status_t watched_synchronize(void *ctx)
{
    stow_status_t st = sim->synchronize(ctx);
    if (st == STOW_OK) {
        oracle.clock++;
        for (unsigned i = 0; i < ORACLE_STREAMS; i++)
            oracle.done_upto[i] = oracle.clock;
    }
    return st;
}

static stow_status_t watched_event_record(void *ctx, stow_stream_t stream, stow_event_t *out)
{
    stow_status_t st = sim->event_record(ctx, stream, out);
    size_t handle = (size_t)(uintptr_t)*out;
    if (st == STOW_OK && handle < ORACLE_EVENTS)
        oracle.events[handle] = (event_note_t){stream_index(stream), ++oracle.clock};
    return st;
}

/* A wait that succeeded: the work queued on its stream before the event is done. */
static stow_status_t watched_event_synchronize(void *ctx, stow_event_t ev)
{
    stow_status_t st = sim->event_synchronize(ctx, ev);
    size_t handle = (size_t)(uintptr_t)ev;
    if (st == STOW_OK && handle < ORACLE_EVENTS) {
        const event_note_t *n = &oracle.events[handle];
        if (oracle.done_upto[n->stream] < n->recorded_at)
            oracle.done_upto[n->stream] = n->recorded_at;
    }
    return st;
}

static stow_status_t watched_unmap(void *ctx, void *va, size_t size_bytes)
{
    uintptr_t lo = (uintptr_t)va, hi = lo + size_bytes;
    for (unsigned i = 0; i < oracle.free_count; i++) {
        const freed_range_t *f = &oracle.frees[i];
        bool overlaps = lo < f->hi && f->lo < hi;
        if (!overlaps || oracle.done_upto[f->stream] >= f->freed_at)
            continue;
        if (oracle.violations++ == 0)
            snprintf(oracle.first_violation, sizeof oracle.first_violation,
                     "unmap of [%#lx,+%zu) while work queued before the free of [%#lx,%#lx) "
                     "may still use it",
                     (unsigned long)lo, size_bytes, (unsigned long)f->lo, (unsigned long)f->hi);
    }
    return sim->unmap(ctx, va, size_bytes);
}

static void assert_no_unsafe_unmap(void)
{
    cr_assert_eq(oracle.violations, 0, "%s", oracle.first_violation);
}

/* ---- the pool ---- */

/* A vmm pool with vmm_slack 0 (every granule beyond the live high-water mark
 * is remapped, not created) on a fresh simulated device with manual events,
 * seen through the oracle. */
static void make_tight_pool(void)
{
    sim = ts_sim(0, false, true);
    cr_assert_not_null(sim);
    oracle.watched = *sim;
    oracle.watched.synchronize = watched_synchronize;
    oracle.watched.event_record = watched_event_record;
    oracle.watched.event_synchronize = watched_event_synchronize;
    oracle.watched.unmap = watched_unmap;
    stow_config_t c;
    stow_config_default(&c);
    c.policy = STOW_POLICY_VMM;
    stow_tuning_t t;
    stow_tuning_default(&t);
    t.vmm_handle_mb = 2; /* a handle per granule */
    t.vmm_slack = 0;
    cr_assert_eq(stow_pool_create_tuned(&c, &t, &oracle.watched, &pool), STOW_OK);
}

static void check(void) { ts_pool_check(pool); }

static stow_stats_t stats(void) { return ts_pool_stats(pool); }

static stow_sim_counters_t device(void)
{
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    return c;
}

static void *alloc_ok(size_t size_bytes)
{
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, size_bytes, NULL, &p), STOW_OK, "alloc %zu", size_bytes);
    return p;
}

/* Frees p (size_bytes, on the default stream), noting the free for the oracle
 * first: an event the free itself records comes after it in stream order. */
static void free_ok(void *p, size_t size_bytes)
{
    oracle.clock++;
    cr_assert_lt(oracle.free_count, ORACLE_FREES, "too many frees for the oracle");
    oracle.frees[oracle.free_count++] =
        (freed_range_t){(uintptr_t)p, (uintptr_t)p + size_bytes, stream_index(NULL), oracle.clock};
    cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
}

/* The default stream's queued work finished. */
static void complete_default_stream(void)
{
    stow_sim_complete_stream(sim, NULL);
    oracle.done_upto[stream_index(NULL)] = ++oracle.clock;
}

/* How the pool waited for queued work, and what it asked of events. */
typedef struct waits {
    uint64_t syncs, event_waits, event_queries, event_records;
} waits_t;

static waits_t waits_now(void)
{
    stow_stats_t s = stats();
    return (waits_t){s.num_sync_all_streams, s.num_event_waits, s.num_event_queries,
                     s.num_event_records};
}

static waits_t waits_since(waits_t before)
{
    waits_t now = waits_now();
    return (waits_t){now.syncs - before.syncs, now.event_waits - before.event_waits,
                     now.event_queries - before.event_queries,
                     now.event_records - before.event_records};
}

/* Frees what is left, checks the books and the oracle, and destroys the pool
 * and the device: nothing may stay mapped or held. */
static void finish(void **live, size_t live_count)
{
    check();
    for (size_t i = 0; i < live_count; i++)
        cr_assert_eq(stow_pool_free(pool, live[i]), STOW_OK);
    check();
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    assert_no_unsafe_unmap();
    ts_sim_assert_released_then_destroy(sim);
}

/* Epochs are closed only for a while after a remap: this one opens that
 * window. a (4 MiB) and b (4 MiB) take 4 granules; a is freed; c (6 MiB)
 * fits not a's hole, raises the live high-water mark to 10 MiB (5 granules):
 * one handle is created and a's two granules are remapped after one event
 * wait (the remap closes the open epoch and waits on its event). The closure
 * ring is then empty. A 4 MiB plug fills a's hole (2 new handles), so that
 * the blocks a test allocates next go above c, at 14 MiB, in address order. */
static void remap_once(void **plug, void **b, void **c)
{
    void *a = alloc_ok(4 * MIB);
    *b = alloc_ok(4 * MIB);
    free_ok(a, 4 * MIB);
    waits_t before = waits_now();
    *c = alloc_ok(6 * MIB);
    waits_t added = waits_since(before);
    cr_assert_eq(stats().num_unmap_calls, 2, "c took a's granules");
    cr_assert_eq(added.event_waits, 1, "the first remap waited on its epoch's event");
    cr_assert_eq(added.syncs, 0);
    cr_assert_eq(device().pending_events, 0);
    *plug = alloc_ok(4 * MIB);
    cr_assert_eq(*plug, a, "a's hole refilled");
    cr_assert_eq(stats().reserved_bytes[STOW_POOL_ALL].current, 7 * G);
}

/* ---- the closure ring (vmm_epochs.c) ---- */

/* Rule: when the ring already holds 8 closed epochs, the next close first
 * retires those whose events completed (it queries them) and then closes its
 * own epoch; it gives up only when the oldest is still pending. Otherwise the
 * granules freed from then on stay in the open epoch, and a later remap waits
 * for work that had long finished.
 * Setup: after remap_once (plug, b and c fill 14 MiB), nine groups of eight
 * 2 MiB blocks x, each group followed by a 2 MiB keeper: one block per
 * granule, 162 MiB more, the live high-water mark 176 MiB (88 granules).
 * Freeing groups 0-7 leaves 64 granules unused, one per free: every 8th free
 * closes an epoch with one event on the default stream, so 8 closures fill
 * the ring, 8 events pending. The stream then completes. Freeing group 8, its
 * 8th free closes a 9th epoch: the ring is full, so the pool queries the 8
 * events (all complete), retires the 8 closures and records one event. The
 * stream completes again; a 144 MiB block fits no hole (the groups' are
 * 16 MiB), goes above the last keeper and brings live bytes back to 176 MiB,
 * so it creates nothing and remaps all 72 unused granules, the 9th epoch's
 * last: one query of its event, which completed, and no wait at all. */
Test(vmm_epochs, a_full_ring_retires_completed_closures_and_closes_the_next_epoch)
{
    make_tight_pool();
    void *plug, *b, *c, *x[9][8], *keeper[9];
    remap_once(&plug, &b, &c);
    for (int g = 0; g < 9; g++) {
        for (int i = 0; i < 8; i++)
            x[g][i] = alloc_ok(2 * MIB);
        keeper[g] = alloc_ok(2 * MIB);
    }
    cr_assert_eq(stats().reserved_bytes[STOW_POOL_ALL].current, 88 * G);
    for (int g = 0; g < CLOSURES; g++)
        for (int i = 0; i < FREES_PER_CLOSURE; i++)
            free_ok(x[g][i], 2 * MIB);
    cr_assert_eq(stats().num_event_records, 1 + CLOSURES, "8 epochs closed, one event each");
    cr_assert_eq(device().pending_events, CLOSURES, "the ring is full of pending closures");
    complete_default_stream();

    waits_t before = waits_now();
    for (int i = 0; i < FREES_PER_CLOSURE; i++)
        free_ok(x[8][i], 2 * MIB);
    waits_t closing = waits_since(before);
    cr_assert_eq(closing.event_queries, CLOSURES, "the full ring's 8 events were queried");
    cr_assert_eq(closing.event_records, 1, "the 9th epoch was closed after the ring emptied");
    cr_assert_eq(device().pending_events, 1, "only the 9th epoch's event is pending");
    check();

    complete_default_stream();
    before = waits_now();
    void *big = alloc_ok(144 * MIB);
    waits_t remap = waits_since(before);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 2 + 72, "every unused granule was remapped");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 88 * G, "no handle created");
    cr_assert_eq(remap.syncs, 0, "no synchronize: every epoch's event had completed");
    cr_assert_eq(remap.event_waits, 0, "no wait: the 9th epoch's event had completed");
    cr_assert_eq(remap.event_queries, 1, "the 9th epoch's event, queried once");
    assert_no_unsafe_unmap();

    void *live[3 + 9 + 1] = {plug, b, c};
    for (int g = 0; g < 9; g++)
        live[3 + g] = keeper[g];
    live[12] = big;
    finish(live, 13);
}

/* Rule: a remap that takes a granule of the open epoch while the ring holds 8
 * pending closures first waits on the oldest closure (making room), closes the
 * open epoch with one event, then waits on every closure up to it, oldest
 * first; it synchronizes the device only when it cannot. Without the first
 * wait there is no room to close the epoch and the remap drains the device.
 * Setup: after remap_once (14 MiB), 64 blocks x of 2 MiB (one granule each),
 * a fence, y (2 MiB) and a top fence: 74 granules, the live high-water mark
 * 148 MiB. Freeing every x closes 8 epochs (one event each, all pending): the
 * ring is full. A 128 MiB block takes the xs' hole back (the same stream: no
 * wait, no backend call), so no granule of a closed epoch is unused any more.
 * Freeing y leaves its granule unused in the open epoch. A 4 MiB block then
 * fits no hole (y's is 2 MiB) and goes above the top fence: live bytes reach
 * 150 MiB (75 granules allowed), so one handle is created and y's granule is
 * remapped for the other. y's granule is in the open epoch: one query of the
 * oldest closure's event (pending), 1 wait on it, 1 event recorded to close
 * the open epoch, then 8 more waits (the 7 older closures left and the new
 * one): 9 waits, no synchronize. */
Test(vmm_epochs, a_remap_of_the_open_epoch_with_a_full_ring_waits_on_events_alone)
{
    make_tight_pool();
    void *plug, *b, *c, *x[64];
    remap_once(&plug, &b, &c);
    for (int i = 0; i < 64; i++)
        x[i] = alloc_ok(2 * MIB);
    void *fence = alloc_ok(2 * MIB);
    void *y = alloc_ok(2 * MIB);
    void *top = alloc_ok(2 * MIB);
    cr_assert_eq(stats().reserved_bytes[STOW_POOL_ALL].current, 74 * G);
    for (int i = 0; i < 64; i++)
        free_ok(x[i], 2 * MIB);
    cr_assert_eq(stats().num_event_records, 1 + CLOSURES, "8 epochs closed, one event each");
    cr_assert_eq(device().pending_events, CLOSURES, "the ring is full of pending closures");

    uint64_t maps = stats().num_map_calls;
    void *refill = alloc_ok(128 * MIB);
    cr_assert_eq(refill, x[0], "the xs' hole taken back");
    cr_assert_eq(stats().num_map_calls, maps, "on granules still mapped");
    free_ok(y, 2 * MIB);

    waits_t before = waits_now();
    void *w = alloc_ok(4 * MIB);
    waits_t remap = waits_since(before);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 2 + 1, "y's granule was remapped");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 75 * G, "one handle created");
    cr_assert_eq(remap.syncs, 0, "waited on events, not on the device");
    cr_assert_eq(remap.event_waits, 1 + CLOSURES, "the 8 closures' and the open epoch's");
    cr_assert_eq(remap.event_records, 1, "the open epoch closed on the default stream");
    cr_assert_eq(remap.event_queries, 1, "the oldest closure's event, before the waits");
    cr_assert_eq(device().pending_events, 0);
    assert_no_unsafe_unmap();

    void *live[] = {plug, b, c, refill, fence, top, w};
    finish(live, sizeof live / sizeof live[0]);
}

/* ---- a backing that fails midway (give_back_created, vmm.c) ---- */

/* Rule: when the device refuses a call midway through backing a request, the
 * handles the attempt created go back, taken from the span's unused granules
 * top down, which include granules the span held unused before the request:
 * work queued before their blocks were freed may still use them, so the pool
 * synchronizes once before it unmaps any (here no remap of the attempt did).
 * Setup: f1 (4 MiB, granules 0-1), f2 (4 MiB, granules 2-3) and a fence k
 * (granule 4). f1 is freed; r (6 MiB, above k) raises the live high-water mark
 * to 12 MiB: one handle created, f1's two granules remapped after a wait on
 * the event that closed their epoch. Then f2 is freed, its work left pending
 * (no event covers it), and its hole merges with f1's: 8 MiB, granules 0-1
 * unmapped, 2-3 mapped and unused. An 8 MiB request fits it exactly; live
 * bytes would reach 16 MiB (8 granules allowed, 6 held), so it creates a
 * handle for granule 0 and maps it, then the device refuses the second call
 * of `refused`:
 * - phys_create: one handle was created, so give_back_created synchronizes,
 *   unmaps granule 3, f2's, and releases its handle (maps 1, unmaps 1);
 * - map: the second handle, created, waits on the free-handle stack and is
 *   released from there; one remains, so the same synchronize and unmap
 *   follow (maps 2, unmaps 1).
 * Either way the pool holds 6 granules, as before, after exactly one
 * synchronize, and the oracle sees no unmap under f2's pending work. */
static void backing_refused_midway(stow_sim_call_t refused, uint64_t maps_tried)
{
    make_tight_pool();
    void *f1 = alloc_ok(4 * MIB), *f2 = alloc_ok(4 * MIB), *k = alloc_ok(2 * MIB);
    free_ok(f1, 4 * MIB);
    void *r = alloc_ok(6 * MIB);
    cr_assert_eq(stats().num_unmap_calls, 2, "r took f1's granules");
    free_ok(f2, 4 * MIB);
    stow_stats_t before = stats();
    cr_assert_eq(before.reserved_bytes[STOW_POOL_ALL].current, 6 * G, "f2's, k's and r's");
    uint64_t device_syncs = device().calls[STOW_SIM_SYNCHRONIZE];

    stow_sim_fail_nth(sim, refused, 2, STOW_EBACKEND);
    void *out = NULL;
    cr_assert_eq(stow_pool_alloc(pool, 8 * MIB, NULL, &out), STOW_EBACKEND);
    stow_sim_fail_nth(sim, refused, 0, STOW_OK);
    stow_stats_t after = stats();
    cr_assert_eq(device().calls[STOW_SIM_SYNCHRONIZE], device_syncs + 1,
                 "one synchronize before the unmap");
    cr_assert_eq(after.num_sync_all_streams, before.num_sync_all_streams + 1);
    cr_assert_eq(after.num_map_calls, before.num_map_calls + maps_tried);
    cr_assert_eq(after.num_unmap_calls, before.num_unmap_calls + 1, "f2's top granule");
    cr_assert_eq(after.reserved_bytes[STOW_POOL_ALL].current, 6 * G, "what the pool held");
    assert_no_unsafe_unmap();
    check();

    void *again = alloc_ok(8 * MIB);
    cr_assert_eq(again, f1, "the same hole, backed this time");
    void *live[] = {k, r, again};
    finish(live, sizeof live / sizeof live[0]);
}

Test(vmm_epochs, a_create_refused_midway_synchronizes_before_unmapping_older_unused_granules)
{
    backing_refused_midway(STOW_SIM_PHYS_CREATE, 1);
}

Test(vmm_epochs, a_map_refused_midway_synchronizes_before_unmapping_older_unused_granules)
{
    backing_refused_midway(STOW_SIM_MAP, 2);
}
