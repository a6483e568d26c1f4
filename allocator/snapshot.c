/*
 * allocator/snapshot.c: a pool's segments, blocks and recorded events, copied
 * out (stowage/snapshot.h).
 *
 * Reads the pool under its lock and changes nothing in it. A classic segment
 * is copied as it is; a page-mapped range is copied as its runs of mapped
 * granules, with its blocks cut at the runs' edges, because physical memory
 * (what a reserved byte is) lies only there: a range's address space is far
 * larger than the memory behind it. Live blocks never cross a run's edge (a
 * granule under a live block is mapped); free ones may, and are cut.
 */
#include "allocator/lock.h"
#include "allocator/pool.h"
#include "allocator/recorder.h"
#include "allocator/types.h"
#include "stowage/snapshot.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- segments and blocks ---- */

typedef struct snap_out {
    stow_snap_segment_t *segments;
    size_t segment_cap, segment_count;
    stow_snap_block_t *blocks;
    size_t block_cap, block_count;
} snap_out_t;

static void put_block(snap_out_t *o, const stow_block_t *b, uintptr_t from, uintptr_t to)
{
    size_t i = o->block_count++;
    if (i >= o->block_cap)
        return;
    stow_snap_block_t *sb = &o->blocks[i];
    memset(sb, 0, sizeof *sb);
    sb->addr = from;
    sb->size_bytes = to - from;
    sb->state = STOW_SNAP_INACTIVE;
    if (b->state == BLOCK_ALLOCATED || b->state == BLOCK_PENDING) {
        sb->state = b->state == BLOCK_ALLOCATED ? STOW_SNAP_ALLOCATED : STOW_SNAP_PENDING_FREE;
        sb->requested_bytes = b->requested_bytes;
        sb->stream = (uint64_t)(uintptr_t)b->owner->stream;
        sb->tag = b->tag;
    }
}

/* Opens a segment at [addr, addr + size); its blocks follow. */
static size_t open_segment(snap_out_t *o, uintptr_t addr, size_t size, unsigned kind, bool run)
{
    size_t i = o->segment_count++;
    if (i < o->segment_cap) {
        stow_snap_segment_t *s = &o->segments[i];
        memset(s, 0, sizeof *s);
        s->addr = addr;
        s->size_bytes = size;
        s->first_block = o->block_count;
        s->pool_kind = kind;
        s->mapped_run = run;
    }
    return i;
}

static void close_segment(snap_out_t *o, size_t i)
{
    if (i < o->segment_cap)
        o->segments[i].block_count = o->block_count - o->segments[i].first_block;
}

static void copy_reservation(snap_out_t *o, const stow_segment_t *seg)
{
    size_t i = open_segment(o, seg->base, seg->size_bytes, seg->pool_kind, false);
    for (const stow_block_t *b = seg->first; b; b = b->next)
        put_block(o, b, b->addr, b->addr + b->size_bytes);
    close_segment(o, i);
}

/* A page-mapped range: one segment per run of mapped granules. */
static void copy_range(snap_out_t *o, const stow_segment_t *seg, size_t granule_bytes)
{
    const stow_block_t *b = seg->first;
    size_t g = 0, n = seg->granules_touched;
    while (g < n) {
        if (!seg->granules[g].phys) {
            g++;
            continue;
        }
        size_t end = g;
        while (end < n && seg->granules[end].phys)
            end++;
        uintptr_t from = seg->base + g * granule_bytes, to = seg->base + end * granule_bytes;
        size_t i = open_segment(o, from, to - from, seg->pool_kind, true);
        while (b && b->addr + b->size_bytes <= from)
            b = b->next;
        for (; b && b->addr < to; b = b->next) {
            uintptr_t b_end = b->addr + b->size_bytes;
            put_block(o, b, b->addr > from ? b->addr : from, b_end < to ? b_end : to);
            if (b_end > to)
                break; /* it goes on past this run: its next piece opens the next run */
        }
        close_segment(o, i);
        g = end;
    }
}

static int by_address(const void *a, const void *b)
{
    uint64_t x = ((const stow_snap_segment_t *)a)->addr, y = ((const stow_snap_segment_t *)b)->addr;
    return x < y ? -1 : x > y;
}

stow_status_t stow_pool_snapshot(stow_pool_t *pool, stow_snap_segment_t *segments,
                                 size_t segment_cap, stow_snap_block_t *blocks, size_t block_cap,
                                 stow_snap_totals_t *totals)
{
    if (!pool || !totals || (!segments && segment_cap) || (!blocks && block_cap))
        return STOW_EINVAL;
    snap_out_t o = {segments, segment_cap, 0, blocks, block_cap, 0};
    stow__lock(&pool->lock);
    for (const stow_segment_t *seg = pool->segments; seg; seg = seg->next) {
        if (seg->granules)
            copy_range(&o, seg, pool->granularity_bytes);
        else
            copy_reservation(&o, seg);
    }
    uint64_t unmapped = pool->vmm ? (uint64_t)pool->free_handle_count * pool->granularity_bytes : 0;
    stow__unlock(&pool->lock);
    if (o.segment_count > 1 && o.segment_count <= segment_cap && o.block_count <= block_cap)
        qsort(segments, o.segment_count, sizeof *segments, by_address);
    memset(totals, 0, sizeof *totals);
    totals->segment_count = o.segment_count;
    totals->block_count = o.block_count;
    totals->unmapped_bytes = unmapped;
    totals->page_mapped = pool->vmm;
    return STOW_OK;
}

/* ---- recorded events ---- */

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t public_kind(uint8_t kind)
{
    switch ((stow_rec_kind_t)kind) {
    case STOW_REC_ALLOC: return STOW_EVENT_ALLOC;
    case STOW_REC_FREE: return STOW_EVENT_FREE;
    case STOW_REC_SEGMENT_RESERVE: return STOW_EVENT_SEGMENT_RESERVE;
    case STOW_REC_SEGMENT_RELEASE: return STOW_EVENT_SEGMENT_RELEASE;
    case STOW_REC_MAP: return STOW_EVENT_MAP;
    case STOW_REC_UNMAP: return STOW_EVENT_UNMAP;
    case STOW_REC_OOM: return STOW_EVENT_OOM;
    case STOW_REC_STEP: return STOW_EVENT_STEP;
    }
    return STOW_EVENT_OOM;
}

/* The stream a recorded index names (0: the shared lists, or none). */
static uint64_t stream_of(const stow_pool_t *pool, unsigned index)
{
    if (index == 0 || index > pool->stream_count)
        return 0;
    return (uint64_t)(uintptr_t)pool->streams[index - 1]->stream;
}

/* Events between two clock samples carry the earlier one: spread them evenly
 * up to the next sample (stow_trace_dump does the same). */
static void spread_ticks(uint64_t *ticks, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i + 1;
        while (j < n && ticks[j] == ticks[i])
            j++;
        if (j < n && ticks[j] > ticks[i])
            for (size_t k = i + 1; k < j; k++)
                ticks[k] = ticks[i] + (ticks[j] - ticks[i]) * (k - i) / (j - i);
        i = j;
    }
}

stow_status_t stow_record_read(stow_pool_t *pool, stow_recorded_event_t *out, size_t cap,
                               size_t *count, uint64_t *start_unix_ns)
{
    if (!pool || !count || (!out && cap))
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    const stow_recorder_t *rec = pool->rec;
    if (!rec) {
        stow__unlock(&pool->lock);
        return STOW_EINVAL;
    }
    size_t kept = rec->count < rec->capacity ? (size_t)rec->count : rec->capacity;
    size_t m = kept < cap ? kept : cap;
    uint64_t *ticks = malloc((m ? m : 1) * sizeof *ticks);
    if (!ticks) {
        stow__unlock(&pool->lock);
        return STOW_EHOSTMEM;
    }
    /* Oldest first: after a wrap the oldest sits at the write position. */
    size_t first = rec->count <= rec->capacity ? 0 : (size_t)(rec->count % rec->capacity);
    for (size_t i = 0; i < m; i++) {
        const stow_rec_event_t *e = &rec->events[(first + i) % rec->capacity];
        stow_recorded_event_t *o = &out[i];
        memset(o, 0, sizeof *o);
        ticks[i] = e->ticks;
        o->addr = e->addr;
        o->size_bytes = e->size;
        o->kind = public_kind(e->kind);
        o->stream = stream_of(pool, e->stream);
        o->tag = e->tag;
    }
    uint64_t t0 = rec->start_ticks, ns0 = rec->start_ns;
    stow__unlock(&pool->lock);
    spread_ticks(ticks, m);
    uint64_t t1 = stow__record_clock(), mono = clock_ns(CLOCK_MONOTONIC);
    uint64_t real = clock_ns(CLOCK_REALTIME);
    double ns_per_tick = t1 > t0 ? (double)(mono - ns0) / (double)(t1 - t0) : 1.0;
    for (size_t i = 0; i < m; i++)
        out[i].time_ns = ticks[i] > t0 ? (uint64_t)((double)(ticks[i] - t0) * ns_per_tick) : 0;
    free(ticks);
    *count = kept;
    if (start_unix_ns)
        *start_unix_ns = real - (mono - ns0);
    return STOW_OK;
}
