/*
 * replay/jemalloc_policy.c: the `jemalloc` replay policies: the trace's
 * requests go to jemalloc 5.3 on the host (mallocx/sdallocx), a reference for
 * the host cost per event of a mature general-purpose allocator.
 *
 * Each instance creates a private arena and allocates with MALLOCX_ARENA(i) |
 * MALLOCX_TCACHE_NONE, so the arena's statistics are exact.
 * - `jemalloc`: dirty_decay_ms and muzzy_decay_ms are -1, so freed pages are
 *   never purged: a cache that never returns memory, as the device pools, with
 *   no madvise() per event. The stricter reference.
 * - `jemalloc-decay` (by name only): jemalloc's own decay times, as it runs
 *   when nobody tunes it.
 * - `jemalloc-tcache` (by name only): `jemalloc` with an explicit thread cache
 *   (tcache.create), as malloc() runs by default. Not the thread's own cache,
 *   which every arena shares: blocks freed into it could go to the CLI's own
 *   malloc() calls and then die with the arena.
 * Destroy flushes the cache, then destroys the arena with what is still live.
 *
 * "Reserved" is the arena's active pages, stats.arenas.<i>.pactive x
 * arenas.page. Reading it needs an "epoch" refresh (tens of microseconds), so
 * timed passes never read it. In the measured pass sample() keeps usable = the
 * sum of nallocx() of live requests, and since active = usable + slack with
 * slack >= 0, it reads pactive only when usable is within a margin of its
 * running peak: max(16 MiB, 2 x the largest slack seen at a read). The peak is
 * exact whenever the slack at the true peak is below the margin. There is no
 * device: --capacity and --min-capacity do not apply.
 */
#include <jemalloc/jemalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "replay/replay_engine.h"

/* Smallest margin of the peak sampling (see je_sample). */
#define JE_MIN_MARGIN_BYTES ((uint64_t)16 << 20)

typedef struct jemalloc_policy {
    unsigned arena;
    int flags;               /* MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE, or
                                | MALLOCX_TCACHE(tcache) for jemalloc-tcache */
    bool has_tcache;
    unsigned tcache;         /* tcache.create's index (has_tcache) */
    size_t page_bytes;       /* arenas.page */
    size_t epoch_mib[1];
    size_t pactive_mib[4];   /* stats.arenas.<arena>.pactive */
    uint64_t usable_bytes;   /* sum of nallocx() of live requests (measured pass) */
    uint64_t usable_peak;    /* its running maximum */
    uint64_t margin_bytes;   /* read stats when usable >= usable_peak - margin */
    uint64_t slack_max;      /* max of active - usable seen at a read */
    uint64_t active_peak;    /* bytes; max of pactive x page over reads */
    uint64_t stat_reads;     /* epoch refreshes done */
} jemalloc_policy_t;

static stow_status_t je_set_decay(unsigned arena, const char *which)
{
    char name[64];
    ssize_t never = -1;
    snprintf(name, sizeof name, "arena.%u.%s", arena, which);
    return mallctl(name, NULL, NULL, &never, sizeof never) ? STOW_EBACKEND : STOW_OK;
}

static void je_destroy(void *ctx)
{
    jemalloc_policy_t *j = ctx;
    if (!j)
        return;
    char name[64];
    /* The cache first: it holds blocks of the arena. */
    if (j->has_tcache)
        (void)mallctl("tcache.destroy", NULL, NULL, &j->tcache, sizeof j->tcache);
    snprintf(name, sizeof name, "arena.%u.destroy", j->arena);
    (void)mallctl(name, NULL, NULL, NULL, 0);
    free(j);
}

/* keep_pages: never purge freed pages (decay -1), else jemalloc's defaults.
 * with_tcache: serve small requests from a cache of the policy's own. */
static stow_status_t je_open(bool keep_pages, bool with_tcache, void **out)
{
    jemalloc_policy_t *j = calloc(1, sizeof *j);
    if (!j)
        return STOW_EHOSTMEM;
    size_t sz = sizeof j->arena;
    if (mallctl("arenas.create", &j->arena, &sz, NULL, 0)) {
        free(j);
        return STOW_EBACKEND;
    }
    char name[64];
    snprintf(name, sizeof name, "stats.arenas.%u.pactive", j->arena);
    size_t epoch_len = 1, pactive_len = 4;
    uint64_t epoch = 1;
    size_t epoch_size = sizeof epoch;
    sz = sizeof j->page_bytes;
    /* stats.arenas.<i> names exist only once an epoch refresh has seen arena i. */
    if ((keep_pages && (je_set_decay(j->arena, "dirty_decay_ms") != STOW_OK ||
                        je_set_decay(j->arena, "muzzy_decay_ms") != STOW_OK)) ||
        mallctl("arenas.page", &j->page_bytes, &sz, NULL, 0) ||
        mallctl("epoch", &epoch, &epoch_size, &epoch, epoch_size) ||
        mallctlnametomib("epoch", j->epoch_mib, &epoch_len) ||
        mallctlnametomib(name, j->pactive_mib, &pactive_len)) {
        je_destroy(j);
        return STOW_EBACKEND;
    }
    j->flags = MALLOCX_ARENA(j->arena) | MALLOCX_TCACHE_NONE;
    if (with_tcache) {
        sz = sizeof j->tcache;
        if (mallctl("tcache.create", &j->tcache, &sz, NULL, 0)) {
            je_destroy(j);
            return STOW_EBACKEND;
        }
        j->has_tcache = true;
        j->flags = MALLOCX_ARENA(j->arena) | MALLOCX_TCACHE(j->tcache);
    }
    j->margin_bytes = JE_MIN_MARGIN_BYTES;
    *out = j;
    return STOW_OK;
}

static stow_status_t je_create(const stow_replay_setup_t *setup, void **out)
{
    (void)setup;
    return je_open(true, false, out);
}

static stow_status_t je_create_decay(const stow_replay_setup_t *setup, void **out)
{
    (void)setup;
    return je_open(false, false, out);
}

static stow_status_t je_create_tcache(const stow_replay_setup_t *setup, void **out)
{
    (void)setup;
    return je_open(true, true, out);
}

static stow_status_t je_alloc(void *ctx, uint64_t size_bytes, uint32_t stream, uint64_t *handle)
{
    (void)stream; /* one host: streams do not matter */
    jemalloc_policy_t *j = ctx;
    if (size_bytes > SIZE_MAX / 2)
        return STOW_EOVERFLOW;
    void *p = mallocx(size_bytes ? (size_t)size_bytes : 1, j->flags);
    if (!p)
        return STOW_ENOMEM;
    *handle = (uint64_t)(uintptr_t)p;
    return STOW_OK;
}

static void je_free(void *ctx, uint64_t handle, uint64_t size_bytes)
{
    jemalloc_policy_t *j = ctx;
    sdallocx((void *)(uintptr_t)handle, size_bytes ? (size_t)size_bytes : 1, j->flags);
}

/* The arena's active bytes now (refreshes every statistic: slow). */
static uint64_t je_active_bytes(jemalloc_policy_t *j)
{
    uint64_t epoch = 1;
    size_t sz = sizeof epoch;
    (void)mallctlbymib(j->epoch_mib, 1, &epoch, &sz, &epoch, sz);
    size_t pactive = 0;
    sz = sizeof pactive;
    if (mallctlbymib(j->pactive_mib, 4, &pactive, &sz, NULL, 0))
        return 0;
    return (uint64_t)pactive * j->page_bytes;
}

static void je_sample(void *ctx, uint64_t handle, uint64_t size_bytes, bool is_alloc)
{
    (void)handle;
    jemalloc_policy_t *j = ctx;
    uint64_t usable = nallocx(size_bytes ? (size_t)size_bytes : 1, j->flags);
    if (!is_alloc) {
        j->usable_bytes -= usable;
        return;
    }
    j->usable_bytes += usable;
    if (j->usable_bytes > j->usable_peak)
        j->usable_peak = j->usable_bytes;
    /* active = usable + slack (slack >= 0); far below the usable peak this
     * cannot be the active peak unless the slack exceeds the margin. */
    if (j->usable_bytes + j->margin_bytes < j->usable_peak)
        return;
    uint64_t active = je_active_bytes(j);
    j->stat_reads++;
    if (active > j->active_peak)
        j->active_peak = active;
    uint64_t slack = active > j->usable_bytes ? active - j->usable_bytes : 0;
    if (slack > j->slack_max)
        j->slack_max = slack;
    if (2 * slack > j->margin_bytes)
        j->margin_bytes = 2 * slack;
}

static void je_report(void *ctx, stow_replay_report_t *out)
{
    jemalloc_policy_t *j = ctx;
    out->peak_reserved_bytes = j->active_peak;
    out->has_backend_calls = false;
    out->fragmentation_at_peak = -1.0;
}

const stow_replay_policy_t stow__replay_policy_jemalloc = {
    "jemalloc", "jemalloc 5.3 mallocx/sdallocx on the host, private arena (reference cost)", false,
    je_create, je_alloc, je_free, je_sample, je_report, je_destroy, false, NULL, false,
};

const stow_replay_policy_t stow__replay_policy_jemalloc_decay = {
    "jemalloc-decay",
    "jemalloc as above with its default decay: freed pages purged (not in all)",
    false, je_create_decay, je_alloc, je_free, je_sample, je_report, je_destroy, true, NULL, false,
};

const stow_replay_policy_t stow__replay_policy_jemalloc_tcache = {
    "jemalloc-tcache",
    "jemalloc as above with a thread cache, as malloc() runs (not in all)",
    false, je_create_tcache, je_alloc, je_free, je_sample, je_report, je_destroy, true, NULL, false,
};
