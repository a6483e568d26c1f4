/*
 * allocator/segment.c: growing the pool, giving memory back, and the
 * out-of-memory path.
 *
 * Growth policy (docs/design.md, growth policy): a small request gets a 2 MiB
 * segment that later small requests share; a medium one (under 10 MiB) a
 * 20 MiB segment that later medium requests share; a large request gets a
 * segment of exactly its size rounded to the backend granularity: PyTorch's
 * sizes. Large segments are never over-provisioned "for later": on real
 * traces that slack is what a caching allocator ends up holding at its peak.
 * Idle segments (no live block) stay cached, so a repeating workload reaches
 * a steady state with no backend calls at all. With release_idle_on_grow (off
 * by default, as in PyTorch), a new segment that would lift reserved memory
 * above its all-time high-water mark first releases idle segments, oldest
 * first, as far as that keeps the mark where it is. A loop whose
 * step needs a little more than the mark would release and reserve segments
 * on every step, so growth that keeps releasing keeps them instead, within
 * keep_idle_max of the allocated peak (keep_idle), and growth that comes back
 * for about the size it released keeps them at once (a regretted release). The
 * garbage-collection threshold, when set, is enforced the same way. When the
 * backend refuses, every idle segment is released and the reservation retried
 * once; then STOW_ENOMEM with an explanation.
 */
#include "allocator/block_store.h"
#include "allocator/planned_serve.h"
#include "allocator/pool.h"
#include "allocator/quick.h"
#include "allocator/recorder.h"
#include "allocator/segment.h"
#include "allocator/stream.h"
#include "allocator/types.h"
#include "allocator/vmm.h"

#include <string.h>
#include <time.h>

#define SMALL_SEGMENT_BYTES ((size_t)2 << 20)
/* Medium requests (over 1 MiB, under 10 MiB) share 20 MiB segments, as
 * PyTorch's kLargeBuffer and kMinLargeAlloc: the classic fallback grows as
 * PyTorch's native allocator does (docs/decisions.md, the classic fallback). */
#define MEDIUM_SEGMENT_BYTES ((size_t)20 << 20)
#define MEDIUM_REQUEST_LIMIT_BYTES ((size_t)10 << 20)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static stow_status_t segment_size_for(const stow_pool_t *pool, unsigned kind, size_t rounded,
                                      size_t *out)
{
    size_t g = pool->granularity_bytes;
    size_t want = kind == STOW_POOL_SMALL                 ? SMALL_SEGMENT_BYTES
                  : rounded < MEDIUM_REQUEST_LIMIT_BYTES ? MEDIUM_SEGMENT_BYTES
                                                         : rounded;
    if (want > SIZE_MAX - (g - 1))
        return STOW_EOVERFLOW;
    *out = (want + g - 1) & ~(g - 1);
    return STOW_OK;
}

static bool segment_idle(const stow_segment_t *seg)
{
    return !seg->granules && seg->live_blocks == 0 && seg->first->state == BLOCK_FREE &&
           seg->first->size_bytes == seg->size_bytes;
}

static void segment_unlink(stow_pool_t *pool, stow_segment_t *seg)
{
    if (seg->prev)
        seg->prev->next = seg->next;
    else
        pool->segments = seg->next;
    if (seg->next)
        seg->next->prev = seg->prev;
}

/* Growth past the mark notes the segments it releases (note_release). A
 * later growth past the mark whose new segment is of the same kind and at
 * least half the size of one of them regrets that release (the entry is used
 * up): the workload came back for that memory, as a loop does every step.
 * That growth keeps the idle segments and lifts the mark by its own, so the
 * next step finds it cached (keep_idle; docs/decisions.md, regretted
 * releases). A workload whose sizes do not come back never regrets. */
static void note_release(stow_pool_t *pool, const stow_segment_t *seg)
{
    stow_idle_keep_t *k = &pool->idle_keep;
    k->released_bytes[k->released_next] = seg->size_bytes;
    k->released_kind[k->released_next] = seg->pool_kind;
    k->released_next = (k->released_next + 1) % STOW_REGRET_SEGMENTS;
}

static bool release_regretted(stow_pool_t *pool, unsigned kind, size_t size)
{
    stow_idle_keep_t *k = &pool->idle_keep;
    for (unsigned i = 0; i < STOW_REGRET_SEGMENTS; i++)
        if (k->released_kind[i] == kind && k->released_bytes[i] >= size &&
            k->released_bytes[i] / 2 <= size) {
            k->released_bytes[i] = 0;
            return true;
        }
    return false;
}

/* Returns an idle segment to the backend; false (and nothing changed) if the
 * backend refused. */
static bool segment_release(stow_pool_t *pool, stow_segment_t *seg)
{
    stow_status_t st = stow__backend_status(
        pool, pool->backend->release(pool->backend->ctx, (void *)seg->base, seg->size_bytes));
    if (st != STOW_OK)
        return false;
    pool->acct.s.num_device_free++;
    stow__record(pool, STOW_REC_SEGMENT_RELEASE, seg->base, seg->size_bytes, 0, 0);
    stow_block_t *b = seg->first;
    stow__pool_index_remove(pool, b);
    stow__block_delete(&pool->blocks, b);
    stow__acct_segment_remove(&pool->acct, seg->pool_kind, seg->size_bytes);
    pool->acct.idle_segment_bytes -= seg->size_bytes;
    segment_unlink(pool, seg);
    free(seg);
    return true;
}

static int by_idle_age(const void *a, const void *b)
{
    const stow_segment_t *x = *(stow_segment_t *const *)a, *y = *(stow_segment_t *const *)b;
    return x->idle_since_op < y->idle_since_op ? -1 : x->idle_since_op > y->idle_since_op;
}

/* Releases idle segments, oldest idle first, until want_bytes are released
 * (all of them when all); noted for regret when note. */
static size_t release_idle(stow_pool_t *pool, bool all, size_t want_bytes, bool note)
{
    size_t count = 0;
    for (stow_segment_t *s = pool->segments; s; s = s->next)
        count += segment_idle(s);
    if (!count)
        return 0;
    size_t released = 0;
    stow_segment_t **idle = malloc(count * sizeof *idle);
    if (!idle) {
        /* No room to sort: release in list order, which is still correct. */
        for (stow_segment_t *s = pool->segments, *next; s && (all || released < want_bytes);
             s = next) {
            next = s->next;
            size_t sz = s->size_bytes;
            if (!segment_idle(s))
                continue;
            if (note)
                note_release(pool, s);
            if (segment_release(pool, s))
                released += sz;
        }
        return released;
    }
    size_t n = 0;
    for (stow_segment_t *s = pool->segments; s; s = s->next)
        if (segment_idle(s))
            idle[n++] = s;
    qsort(idle, n, sizeof *idle, by_idle_age); /* oldest idle first */
    for (size_t i = 0; i < n && (all || released < want_bytes); i++) {
        size_t sz = idle[i]->size_bytes;
        if (note)
            note_release(pool, idle[i]);
        if (segment_release(pool, idle[i]))
            released += sz;
    }
    free(idle);
    return released;
}

size_t stow__segment_release_idle(stow_pool_t *pool, bool all, size_t want_bytes)
{
    return release_idle(pool, all, want_bytes, false);
}

void stow__segment_release_all(stow_pool_t *pool)
{
    /* Destroy path: every pending event is moot, every segment goes, after
     * the device finished what may still use them (granules are unmapped,
     * which does not wait; a classic segment's release waits itself). */
    if (pool->pending || pool->vmm || (pool->has_events && pool->stream_count))
        (void)stow__pool_synchronize(pool);
    stow__stream_drop_pending(pool);
    while (pool->segments) {
        stow_segment_t *seg = pool->segments;
        /* Blocks go with their chunks at destroy; their record_stream lists
         * are separate allocations. */
        for (stow_block_t *b = seg->first; b; b = b->next) {
            free(b->uses);
            b->uses = NULL;
        }
        if (seg->granules) {
            stow__vmm_release_segment(pool, seg);
            segment_unlink(pool, seg);
            free(seg);
            continue;
        }
        stow__backend_status(pool, pool->backend->release(pool->backend->ctx, (void *)seg->base,
                                                          seg->size_bytes));
        pool->acct.s.num_device_free++;
        stow__acct_segment_remove(&pool->acct, seg->pool_kind, seg->size_bytes);
        segment_unlink(pool, seg);
        free(seg);
    }
    if (pool->vmm)
        stow__vmm_release_all_handles(pool);
}

void stow__segment_install(stow_pool_t *pool, stow_segment_t *seg, stow_block_t *b,
                           stow_stream_state_t *ss, uintptr_t base, size_t size, unsigned kind)
{
    seg->base = base;
    seg->size_bytes = size;
    seg->pool_kind = (uint8_t)kind;
    seg->first = b;
    seg->idle_since_op = pool->op_count;
    seg->next = pool->segments;
    if (pool->segments)
        pool->segments->prev = seg;
    pool->segments = seg;
    b->addr = base;
    b->size_bytes = size;
    b->segment = seg;
    b->pool_kind = (uint8_t)kind;
    b->state = BLOCK_FREE;
    b->owner = pool->has_events ? ss : pool->any;
    b->free_seq = ++b->owner->free_seq;
    stow__pool_index_insert(pool, b);
}

/* Reserves size bytes within the pool's limit; STOW_ENOMEM when either the
 * limit or the device says no. */
static stow_status_t reserve_within_limit(stow_pool_t *pool, stow_stream_state_t *ss,
                                          size_t size, void **out)
{
    uint64_t reserved = pool->acct.s.reserved_bytes[STOW_POOL_ALL].current;
    if (size > pool->limit_bytes || reserved > pool->limit_bytes - size)
        return STOW_ENOMEM;
    stow_status_t st = stow__backend_status(
        pool, pool->backend->reserve(pool->backend->ctx, size, ss->is_any ? NULL : ss->stream,
                                     out));
    if (st == STOW_OK)
        pool->acct.s.num_device_alloc++;
    return st;
}

bool stow__segment_sync_for_release(stow_pool_t *pool)
{
    if (!stow__pool_release_needs_sync(pool))
        return true;
    if (!stow__pool_synchronize(pool))
        return false;
    uint64_t scrubs_before = pool->acct.s.num_scrubs;
    stow__stream_clear_all_synchronized(pool);
    /* Pending blocks just freed were scrubbed on their streams: that memset is
     * queued work again, on granules about to be unmapped, so it is waited for
     * too (a classic segment's release waits by itself). Found by fuzz_api's
     * device-work oracle. */
    if (pool->vmm && pool->acct.s.num_scrubs != scrubs_before)
        return stow__pool_synchronize(pool);
    return true;
}

/* Releases everything cached that can be released: after a device
 * synchronize, blocks freed on any stream are free for all, so split-off
 * pieces from different streams merge and whole segments come back. */
void stow__segment_release_cache_for_retry(stow_pool_t *pool)
{
    stow__quick_flush(pool);
    /* Unused granules may still be under queued work until a synchronize
     * succeeded: unmapped anyway, their next owner's data could be overwritten
     * by the last one's kernels (found by fuzz_api's device-work oracle). */
    if (stow__segment_sync_for_release(pool)) {
        /* The planned arena first, when no slot is busy: its memory may be
         * what the request needs, and its layout is taken again later. */
        if (pool->planned)
            stow__planned_release(pool);
        if (pool->vmm)
            stow__vmm_release_unused(pool);
    }
    stow__segment_release_idle(pool, true, 0);
}

static void format_bytes(char *buf, size_t len, uint64_t bytes)
{
    if (bytes >= ((uint64_t)1 << 30))
        snprintf(buf, len, "%.2f GiB", (double)bytes / (double)(1u << 30));
    else
        snprintf(buf, len, "%.2f MiB", (double)bytes / (double)(1u << 20));
}

/* What a user can do about it, in the spirit of PyTorch's message. */
static const char *reserve_hint(const stow_pool_t *pool, uint64_t cached_bytes)
{
    if (cached_bytes > pool->limit_bytes / 4)
        return " Much of it is free but fragmented: try max_split_size_mb in STOWAGE_CONF "
               "so that large cached blocks are not split by small requests.";
    return "";
}

/* The figures both out-of-memory messages give, formatted. */
typedef struct oom_figures {
    char requested[32], reserved[32], allocated[32], not_allocated[32], capacity[32], limit[32];
} oom_figures_t;

static void oom_figures(const stow_pool_t *pool, size_t requested, uint64_t reserved,
                        uint64_t active, oom_figures_t *f)
{
    format_bytes(f->requested, sizeof f->requested, requested);
    format_bytes(f->reserved, sizeof f->reserved, reserved);
    format_bytes(f->allocated, sizeof f->allocated,
                 pool->acct.s.allocated_bytes[STOW_POOL_ALL].current);
    format_bytes(f->not_allocated, sizeof f->not_allocated, reserved - active);
    format_bytes(f->capacity, sizeof f->capacity, pool->capacity_bytes);
    format_bytes(f->limit, sizeof f->limit, pool->limit_bytes);
}

/* A page-mapped pool has no segments to split or release: after the retry
 * it holds physical memory only under live blocks, and what is not allocated
 * is the rest of granules that live blocks share (or blocks waiting for their
 * streams). max_split_size_mb does not apply to it. */
static void explain_vmm_oom(stow_pool_t *pool, size_t requested, const oom_figures_t *f,
                            bool retried)
{
    snprintf(pool->oom_message, sizeof pool->oom_message,
             "stowage: out of memory: tried to allocate %s (%zu bytes) in a page-mapped pool. "
             "Device capacity %s, pool limit %s. The pool holds %s of physical memory, of "
             "which %s is allocated and %s is not: the rest of granules that live blocks "
             "share.%s%s",
             f->requested, requested, f->capacity, f->limit, f->reserved, f->allocated,
             f->not_allocated,
             retried ? " Unused granules were unmapped and the request retried." : "",
             requested > pool->limit_bytes ? " The request alone is larger than the pool limit."
                                           : "");
}

void stow__segment_explain_oom(stow_pool_t *pool, size_t requested, size_t segment_bytes,
                               bool retried)
{
    stow__record(pool, STOW_REC_OOM, 0, requested, 0, stow__current_tag);
    uint64_t reserved = pool->acct.s.reserved_bytes[STOW_POOL_ALL].current;
    uint64_t active = stow__acct_active_bytes(&pool->acct, STOW_POOL_ALL);
    oom_figures_t f;
    oom_figures(pool, requested, reserved, active, &f);
    if (pool->vmm) {
        explain_vmm_oom(pool, requested, &f, retried);
        return;
    }
    char seg[32], largest[32];
    format_bytes(seg, sizeof seg, segment_bytes);
    format_bytes(largest, sizeof largest, stow__pool_largest_free(pool));
    snprintf(pool->oom_message, sizeof pool->oom_message,
             "stowage: out of memory: tried to allocate %s (%zu bytes; a new segment of %s). "
             "Device capacity %s, pool limit %s. The pool has %s reserved, of which %s is "
             "allocated and %s is free but cached; the largest free block is %s. The cache was "
             "released and the request retried.%s",
             f.requested, requested, seg, f.capacity, f.limit, f.reserved, f.allocated,
             f.not_allocated, largest, reserve_hint(pool, reserved - active));
}

/* Growth past the high-water mark that releases idle segments, in windows of
 * KEEP_WINDOW_OPS pool operations: KEEP_HOT_WINDOWS windows in a row with one
 * such growth per KEEP_OPS_PER_RELEASE operations or more (65,536 operations
 * at least) make the pool keep idle segments from then on. A loop that needs
 * a segment or two beyond the mark over its step would otherwise release one
 * and reserve another on every step, each a cudaFree (which synchronizes the
 * device) and a cudaMalloc (docs/decisions.md, keep_idle_max). */
#define KEEP_WINDOW_OPS 8192
#define KEEP_HOT_WINDOWS 8
#define KEEP_OPS_PER_RELEASE 1024

/* Whether a growth that would take reserved memory to reserved_after, past
 * the high-water mark, keeps the idle segments instead of releasing them:
 * only once growth has kept releasing them (above), only while reserved_after
 * stays within (1 + keep_idle_max) x the allocated peak, so that what is kept
 * stays bounded whatever the workload does next, and only while as much again
 * stays free below the pool's limit; or when the growth regrets a release
 * (above), within that headroom only. Kept segments are split by other sizes
 * too, and the blocks placed in them are live, so the out-of-memory retry
 * cannot take them back: kept close to the limit, they would make a loop that
 * fits when releasing fail on that device. */
static bool keep_idle(stow_pool_t *pool, uint64_t reserved_after, unsigned kind, size_t size)
{
    stow_idle_keep_t *k = &pool->idle_keep;
    double keep_max = pool->tuning.keep_idle_max;
    if (keep_max <= 0.0)
        return false;
    bool regret = release_regretted(pool, kind, size);
    if (k->keeping || regret) {
        double allocated_peak = (double)pool->acct.s.allocated_bytes[STOW_POOL_ALL].peak;
        double reserved = (double)reserved_after, room = keep_max * allocated_peak;
        if ((regret || reserved <= allocated_peak + room) &&
            reserved + room <= (double)pool->limit_bytes) {
            pool->acct.s.num_idle_keeps++;
            return true;
        }
        return false;
    }
    uint64_t ops = pool->op_count - k->window_start_op;
    if (ops >= KEEP_WINDOW_OPS) {
        bool hot = k->window_releases * KEEP_OPS_PER_RELEASE >= ops;
        k->hot_windows = hot ? k->hot_windows + 1 : 0;
        k->window_start_op = pool->op_count;
        k->window_releases = 0;
        if (k->hot_windows == KEEP_HOT_WINDOWS) {
            k->keeping = true;
            return keep_idle(pool, reserved_after, kind, size);
        }
    }
    k->window_releases++;
    return false;
}

stow_status_t stow__segment_grow(stow_pool_t *pool, stow_stream_state_t *ss, unsigned kind,
                                 size_t rounded, size_t requested, stow_block_t **out)
{
    size_t size;
    if (segment_size_for(pool, kind, rounded, &size) != STOW_OK)
        return STOW_EOVERFLOW;
    stow_segment_t *seg = calloc(1, sizeof *seg);
    stow_block_t *b = stow__block_new(&pool->blocks);
    if (!seg || !b) {
        free(seg);
        if (b)
            stow__block_delete(&pool->blocks, b);
        return STOW_EHOSTMEM;
    }
    uint64_t reserved = pool->acct.s.reserved_bytes[STOW_POOL_ALL].current;
    double gc = pool->config.garbage_collection_threshold;
    if (gc > 0.0 && (double)(reserved + size) > gc * (double)pool->limit_bytes)
        pool->acct.s.num_idle_releases += stow__segment_release_idle(
            pool, false, (size_t)((double)(reserved + size) - gc * (double)pool->limit_bytes)) > 0;
    else if (pool->config.release_idle_on_grow && pool->acct.idle_segment_bytes &&
             reserved + size > pool->reserved_high_water_bytes &&
             !keep_idle(pool, reserved + size, kind, size))
        pool->acct.s.num_idle_releases +=
            release_idle(pool, false, (size_t)(reserved + size - pool->reserved_high_water_bytes),
                         true) > 0;

    void *ptr = NULL;
    stow_status_t st = reserve_within_limit(pool, ss, size, &ptr);
    if (st == STOW_ENOMEM) {
        uint64_t t0 = now_ns();
        pool->acct.s.num_alloc_retries++;
        stow__segment_release_cache_for_retry(pool);
        st = reserve_within_limit(pool, ss, size, &ptr);
        /* A shared (small or medium) segment that does not fit: a segment of
         * just the request's size may still. */
        size_t exact = (rounded + pool->granularity_bytes - 1) & ~(pool->granularity_bytes - 1);
        if (st == STOW_ENOMEM && exact < size) {
            size = exact;
            st = reserve_within_limit(pool, ss, size, &ptr);
        }
        pool->acct.s.retry_time_ns += now_ns() - t0;
    }
    if (st != STOW_OK) {
        free(seg);
        stow__block_delete(&pool->blocks, b);
        if (st == STOW_ENOMEM) {
            pool->acct.s.num_ooms++;
            stow__segment_explain_oom(pool, requested, size, true);
            return STOW_ENOMEM;
        }
        return STOW_EBACKEND;
    }
    stow__acct_segment_add(&pool->acct, kind, size);
    stow__record(pool, STOW_REC_SEGMENT_RESERVE, (uintptr_t)ptr, size, ss->index, 0);
    pool->acct.idle_segment_bytes += size;
    if (pool->acct.s.reserved_bytes[STOW_POOL_ALL].current > pool->reserved_high_water_bytes)
        pool->reserved_high_water_bytes = pool->acct.s.reserved_bytes[STOW_POOL_ALL].current;
    stow__segment_install(pool, seg, b, ss, (uintptr_t)ptr, size, kind);
    *out = b;
    return STOW_OK;
}
