/*
 * tests/unit/test_snapshot.c: stow_pool_snapshot and stow_record_read
 * (allocator/snapshot.c) on the simulated device, for classic and page-mapped
 * pools.
 *
 * The snapshot is checked against what the test holds and against the pool's
 * books after every few operations of a random workload on two streams, with
 * record_stream uses left pending: segments by address, apart; blocks tiling
 * each segment; the segments' bytes and the unmapped bytes adding up to
 * reserved_bytes; ALLOCATED blocks being exactly the live pointers, with their
 * requested sizes, streams and tags; allocated, requested and active bytes
 * equal to the stats.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "stowage/record.h"
#include "stowage/snapshot.h"
#include "test_support.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define S1 ((stow_stream_t)(uintptr_t)0x1000)
#define S2 ((stow_stream_t)(uintptr_t)0x2000)
#define LIVE_MAX 96

static stow_backend_t *sim;
static stow_pool_t *pool;

static void make_pool(const char *conf)
{
    sim = ts_sim(0, false, true);
    pool = ts_pool(conf, sim);
}

static void finish(void)
{
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    ts_sim_assert_released_then_destroy(sim);
}

typedef struct live {
    void *ptr;
    size_t size;
    stow_stream_t stream;
    unsigned tag;
} live_t;

typedef struct snap {
    stow_snap_segment_t *seg;
    stow_snap_block_t *blk;
    stow_snap_totals_t t;
} snap_t;

static snap_t take(void)
{
    snap_t s;
    cr_assert_eq(stow_pool_snapshot(pool, NULL, 0, NULL, 0, &s.t), STOW_OK);
    s.seg = calloc(s.t.segment_count + 1, sizeof *s.seg);
    s.blk = calloc(s.t.block_count + 1, sizeof *s.blk);
    stow_snap_totals_t again;
    cr_assert_eq(stow_pool_snapshot(pool, s.seg, s.t.segment_count, s.blk, s.t.block_count,
                                    &again), STOW_OK);
    cr_assert_eq(again.segment_count, s.t.segment_count, "the pool changed between two calls");
    cr_assert_eq(again.block_count, s.t.block_count);
    return s;
}

/* Every invariant of stowage/snapshot.h, against the books and the live set. */
static void check(const live_t *live, size_t n_live)
{
    snap_t s = take();
    stow_stats_t st = ts_pool_stats(pool);
    uint64_t seg_bytes = 0, alloc_bytes = 0, req_bytes = 0, pending_bytes = 0;
    size_t allocated_blocks = 0, next_block = 0;
    for (size_t i = 0; i < s.t.segment_count; i++) {
        const stow_snap_segment_t *g = &s.seg[i];
        cr_assert_gt(g->size_bytes, 0);
        cr_assert_gt(g->block_count, 0, "segment %zu has no block", i);
        if (i)
            cr_assert_geq(g->addr, s.seg[i - 1].addr + s.seg[i - 1].size_bytes,
                          "segments %zu and %zu overlap or are out of order", i - 1, i);
        cr_assert(g->pool_kind == STOW_POOL_SMALL || g->pool_kind == STOW_POOL_LARGE);
        seg_bytes += g->size_bytes;
        uint64_t at = g->addr;
        for (uint64_t k = g->first_block; k < g->first_block + g->block_count; k++) {
            const stow_snap_block_t *b = &s.blk[k];
            cr_assert_eq(b->addr, at, "segment %zu: block %llu is not where the last ended", i,
                         (unsigned long long)k);
            cr_assert_gt(b->size_bytes, 0);
            at += b->size_bytes;
            if (b->state == STOW_SNAP_ALLOCATED) {
                allocated_blocks++;
                alloc_bytes += b->size_bytes;
                req_bytes += b->requested_bytes;
                cr_assert_leq(b->requested_bytes, b->size_bytes);
            } else if (b->state == STOW_SNAP_PENDING_FREE) {
                pending_bytes += b->size_bytes;
            } else {
                cr_assert_eq(b->state, STOW_SNAP_INACTIVE);
                cr_assert_eq(b->requested_bytes, 0);
                cr_assert_eq(b->stream, 0);
            }
        }
        cr_assert_eq(at, g->addr + g->size_bytes, "segment %zu: its blocks do not tile it", i);
        next_block += g->block_count;
    }
    cr_assert_eq(next_block, s.t.block_count, "blocks outside every segment");
    cr_assert_eq(seg_bytes + s.t.unmapped_bytes, st.reserved_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(alloc_bytes, st.allocated_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(req_bytes, st.requested_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(alloc_bytes + pending_bytes, st.active_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(allocated_blocks, n_live);
    for (size_t j = 0; j < n_live; j++) {
        const stow_snap_block_t *found = NULL;
        for (size_t k = 0; k < s.t.block_count && !found; k++)
            if (s.blk[k].addr == (uintptr_t)live[j].ptr && s.blk[k].state == STOW_SNAP_ALLOCATED)
                found = &s.blk[k];
        cr_assert_not_null(found, "live %p is not an ALLOCATED block", live[j].ptr);
        cr_assert_eq(found->requested_bytes, live[j].size);
        cr_assert_eq(found->stream, (uint64_t)(uintptr_t)live[j].stream);
        cr_assert_eq(found->tag, live[j].tag);
    }
    free(s.seg);
    free(s.blk);
}

/* A random workload on two streams: sizes from 512 B to 24 MiB, a fifth of
 * the frees with a record_stream use on the other stream, completed later. */
static void workload(unsigned steps)
{
    live_t live[LIVE_MAX];
    size_t n = 0;
    uint64_t rng = 0x5eed5eedull;
    unsigned tag_a, tag_b;
    cr_assert_eq(stow_tag_set("snap_a", &tag_a), STOW_OK);
    cr_assert_eq(stow_tag_set("snap_b", &tag_b), STOW_OK);
    for (unsigned i = 0; i < steps; i++) {
        uint64_t r = ts_xorshift(&rng);
        if (n < LIVE_MAX && (n == 0 || r % 5 < 3)) {
            static const size_t sizes[] = {512, 3000, 64 * KIB, 700 * KIB, 2 * MIB, 5 * MIB + 512,
                                           24 * MIB};
            size_t size = sizes[(r >> 8) % 7] - (size_t)((r >> 16) % 256);
            stow_stream_t stream = (r >> 24) & 1 ? S2 : S1;
            unsigned tag = (r >> 28) & 1 ? tag_a : tag_b;
            cr_assert_eq(stow_tag_set(stow_tag_name(tag), NULL), STOW_OK);
            void *p;
            cr_assert_eq(stow_pool_alloc(pool, size, stream, &p), STOW_OK);
            live[n++] = (live_t){p, size, stream, tag};
        } else {
            size_t j = (size_t)(r >> 8) % n;
            if ((r >> 40) % 5 == 0)
                cr_assert_eq(stow_record_stream(pool, live[j].ptr,
                                                live[j].stream == S1 ? S2 : S1), STOW_OK);
            cr_assert_eq(stow_pool_free(pool, live[j].ptr), STOW_OK);
            live[j] = live[--n];
        }
        if ((r >> 50) % 17 == 0)
            stow_sim_complete_stream(sim, (r >> 56) & 1 ? S1 : S2);
        if (i % 25 == 0)
            check(live, n);
        if (i % 200 == 199)
            cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    }
    check(live, n);
    for (size_t j = 0; j < n; j++)
        cr_assert_eq(stow_pool_free(pool, live[j].ptr), STOW_OK);
    stow_sim_complete_stream(sim, S1);
    stow_sim_complete_stream(sim, S2);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    check(NULL, 0);
    stow_tag_set(NULL, NULL);
}

Test(snapshot, classic_pool_matches_its_books)
{
    make_pool("policy:classic");
    workload(1200);
    finish();
}

Test(snapshot, page_mapped_pool_matches_its_books)
{
    make_pool("policy:vmm");
    workload(1200);
    finish();
}

/* A page-mapped pool's free blocks span unmapped address space: the snapshot
 * holds only the mapped runs, and cuts the free blocks at their edges. */
Test(snapshot, page_mapped_runs_cut_free_blocks)
{
    make_pool("policy:vmm,vmm_slack:0");
    void *a, *b, *c;
    cr_assert_eq(stow_pool_alloc(pool, 8 * MIB, S1, &a), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 8 * MIB, S1, &b), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 8 * MIB, S1, &c), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK); /* b's granules unmapped */
    live_t live[2] = {{a, 8 * MIB, S1, 0}, {c, 8 * MIB, S1, 0}};
    check(live, 2);
    snap_t s = take();
    size_t runs = 0;
    for (size_t i = 0; i < s.t.segment_count; i++) {
        cr_assert_eq(s.seg[i].mapped_run, 1);
        runs++;
    }
    cr_assert_geq(runs, 2, "a and c are apart, with b's unmapped granules between them");
    cr_assert_eq(s.t.page_mapped, 1);
    free(s.seg);
    free(s.blk);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    finish();
}

Test(snapshot, counts_beyond_the_capacity_and_bad_arguments)
{
    make_pool("policy:classic");
    void *p[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(stow_pool_alloc(pool, 30 * MIB, S1, &p[i]), STOW_OK);
    stow_snap_segment_t one;
    stow_snap_block_t blk;
    stow_snap_totals_t t;
    cr_assert_eq(stow_pool_snapshot(pool, &one, 1, &blk, 1, &t), STOW_OK);
    cr_assert_eq(t.segment_count, 3);
    cr_assert_geq(t.block_count, 3);
    cr_assert_eq(t.page_mapped, 0);
    cr_assert_eq(stow_pool_snapshot(NULL, NULL, 0, NULL, 0, &t), STOW_EINVAL);
    cr_assert_eq(stow_pool_snapshot(pool, NULL, 1, NULL, 0, &t), STOW_EINVAL);
    cr_assert_eq(stow_pool_snapshot(pool, NULL, 0, NULL, 0, NULL), STOW_EINVAL);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    finish();
}

Test(record_read, events_in_order_with_streams_sizes_and_times)
{
    make_pool("policy:classic");
    size_t count = 12345;
    cr_assert_eq(stow_record_read(pool, NULL, 0, &count, NULL), STOW_EINVAL);
    cr_assert_eq(count, 12345, "count written on an error");
    cr_assert_eq(stow_record_start(pool, 1000), STOW_OK);
    unsigned tag;
    cr_assert_eq(stow_tag_set("rr", &tag), STOW_OK);
    void *a, *b;
    cr_assert_eq(stow_pool_alloc(pool, 1000, S1, &a), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 40 * MIB, S2, &b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    stow_tag_set(NULL, NULL);
    cr_assert_eq(stow_record_read(pool, NULL, 0, &count, NULL), STOW_OK);
    stow_recorded_event_t ev[32];
    cr_assert_leq(count, 32);
    uint64_t start = 0;
    cr_assert_eq(stow_record_read(pool, ev, 32, &count, &start), STOW_OK);
    cr_assert_gt(start, (uint64_t)1600000000 * 1000000000ull, "a wall-clock time");
    /* Two segments reserved, two allocations, two frees, in the order they happened. */
    int allocs = 0, frees = 0, reserves = 0;
    for (size_t i = 0; i < count; i++) {
        if (i)
            cr_assert_geq(ev[i].time_ns, ev[i - 1].time_ns);
        if (ev[i].kind == STOW_EVENT_ALLOC) {
            cr_assert_eq(ev[i].addr, (uintptr_t)(allocs ? b : a));
            cr_assert_eq(ev[i].size_bytes, allocs ? 40 * MIB : 1000);
            cr_assert_eq(ev[i].stream, (uint64_t)(uintptr_t)(allocs ? S2 : S1));
            cr_assert_eq(ev[i].tag, tag);
            allocs++;
        } else if (ev[i].kind == STOW_EVENT_FREE) {
            cr_assert_eq(ev[i].addr, (uintptr_t)(frees ? b : a));
            cr_assert_geq(ev[i].size_bytes, frees ? 40 * MIB : 1024, "the block's size");
            frees++;
        } else if (ev[i].kind == STOW_EVENT_SEGMENT_RESERVE) {
            cr_assert_eq(allocs, reserves, "a segment is reserved before its allocation");
            reserves++;
        }
    }
    cr_assert_eq(allocs, 2);
    cr_assert_eq(frees, 2);
    cr_assert_eq(reserves, 2);
    /* A smaller array gets the oldest events and the full count. */
    size_t full = count;
    cr_assert_eq(stow_record_read(pool, ev, 2, &count, NULL), STOW_OK);
    cr_assert_eq(count, full);
    cr_assert_eq(ev[0].kind, STOW_EVENT_SEGMENT_RESERVE);
    finish();
}

Test(record_read, a_wrapped_ring_gives_the_newest_oldest_first)
{
    make_pool("policy:classic");
    cr_assert_eq(stow_record_start(pool, 8), STOW_OK);
    void *p;
    for (size_t i = 1; i <= 20; i++) {
        cr_assert_eq(stow_pool_alloc(pool, i * 512, S1, &p), STOW_OK);
        cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
    }
    stow_recorded_event_t ev[8];
    size_t count;
    cr_assert_eq(stow_record_read(pool, ev, 8, &count, NULL), STOW_OK);
    cr_assert_eq(count, 8);
    /* The last four allocations (17..20 x 512 B), each followed by its free. */
    for (size_t i = 0; i < 8; i++) {
        cr_assert_eq(ev[i].kind, i % 2 ? STOW_EVENT_FREE : STOW_EVENT_ALLOC);
        if (i % 2 == 0)
            cr_assert_eq(ev[i].size_bytes, (17 + i / 2) * 512);
    }
    finish();
}
