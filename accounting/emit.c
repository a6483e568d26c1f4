/*
 * accounting/emit.c: the text summary and the JSON form of a stow_stats_t.
 * Both are driven by the X-macro field lists of stowage/stats.h, so a new
 * figure shows up everywhere at once. Output goes into a caller buffer with
 * snprintf semantics (the full length is returned even when truncated).
 */
#include "stowage.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

typedef struct out_buf {
    char *buf;
    size_t cap;
    size_t len; /* full length that would have been written */
} out_buf_t;

__attribute__((format(printf, 2, 3))) static void put(out_buf_t *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

/* Inner width of the summary table: "| " + 84 characters + " |". */
#define SUMMARY_WIDTH 84

/* One table line: the text, padded (or cut) to the table width. */
__attribute__((format(printf, 2, 3))) static void put_row(out_buf_t *o, const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    put(o, "| %-*.*s |\n", SUMMARY_WIDTH, SUMMARY_WIDTH, text);
}

static void put_rule(out_buf_t *o, char c)
{
    char line[SUMMARY_WIDTH + 5];
    line[0] = '|';
    for (int i = 1; i <= SUMMARY_WIDTH + 2; i++)
        line[i] = c;
    line[SUMMARY_WIDTH + 3] = '|';
    line[SUMMARY_WIDTH + 4] = '\0';
    put(o, "%s\n", line);
}

static size_t finish(out_buf_t *o)
{
    if (o->cap)
        o->buf[o->len < o->cap ? o->len : o->cap - 1] = '\0';
    return o->len;
}

/* "12.34 GiB" style, fixed width, as torch.cuda.memory_summary does. */
static const char *human_bytes(uint64_t bytes, char *tmp, size_t tmp_len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    unsigned u = 0;
    while (v >= 1024.0 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(tmp, tmp_len, "%" PRIu64 " B", bytes);
    else
        snprintf(tmp, tmp_len, "%.2f %s", v, units[u]);
    return tmp;
}

static const char *const pool_kind_label[STOW_POOL_KINDS] = {"", "      from small pool",
                                                             "      from large pool"};
static const char *const pool_kind_key[STOW_POOL_KINDS] = {"all", "small_pool", "large_pool"};

static void summary_stat_rows(out_buf_t *o, const char *label, const stow_stat_t *arr,
                              bool is_bytes)
{
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++) {
        char c[32], p[32], a[32], f[32];
        const stow_stat_t *st = &arr[k];
        if (is_bytes) {
            human_bytes(st->current, c, sizeof c);
            human_bytes(st->peak, p, sizeof p);
            human_bytes(st->allocated, a, sizeof a);
            human_bytes(st->freed, f, sizeof f);
        } else {
            snprintf(c, sizeof c, "%" PRIu64, st->current);
            snprintf(p, sizeof p, "%" PRIu64, st->peak);
            snprintf(a, sizeof a, "%" PRIu64, st->allocated);
            snprintf(f, sizeof f, "%" PRIu64, st->freed);
        }
        put_row(o, "%-24s | %12s | %12s | %12s | %12s", k == 0 ? label : pool_kind_label[k], c,
                p, a, f);
    }
    put_rule(o, '-');
}

static bool name_is_bytes(const char *name)
{
    size_t n = 0;
    while (name[n])
        n++;
    return n > 6 && name[n - 6] == '_' && name[n - 5] == 'b' && name[n - 4] == 'y';
}

size_t stow_stats_summary(const stow_stats_t *s, char *buf, size_t buf_len)
{
    out_buf_t o = {buf, buf_len, 0};
    if (!s)
        return finish(&o);
    char t1[32], t2[32], t3[32];
    put_rule(&o, '=');
    put_row(&o, "%*s", (SUMMARY_WIDTH + 22) / 2, "Stowage memory summary");
    put_rule(&o, '-');
    put_row(&o, "OOMs: %" PRIu64 "   alloc retries: %" PRIu64 "   time retrying: %.3f ms",
            s->num_ooms, s->num_alloc_retries, (double)s->retry_time_ns / 1e6);
    put_rule(&o, '=');
    put_row(&o, "%-24s | %12s | %12s | %12s | %12s", "Metric", "Cur Usage", "Peak Usage",
            "Tot Alloc", "Tot Freed");
    put_rule(&o, '-');
#define SUMMARY_ROW_(name, label) summary_stat_rows(&o, label, s->name, name_is_bytes(#name));
    STOW_STAT_ARRAY_FIELDS(SUMMARY_ROW_)
#undef SUMMARY_ROW_
    put_row(&o, "Free cached %s; largest free block %s",
            human_bytes(s->free_reserved_bytes, t1, sizeof t1),
            human_bytes(s->largest_free_block_bytes, t2, sizeof t2));
    put_row(&o, "Fragmentation (1 - largest free / free cached) %.1f%%, peak %.1f%%",
            100.0 * s->fragmentation, 100.0 * s->fragmentation_peak);
    put_row(&o, "Device capacity %s, pool limit %s",
            human_bytes(s->capacity_bytes, t1, sizeof t1),
            human_bytes(s->limit_bytes, t2, sizeof t2));
    const stow_waste_t *w = &s->waste_at_peak;
    put_rule(&o, '-');
    put_row(&o, "At the reserved peak (%s):", human_bytes(w->reserved_bytes, t1, sizeof t1));
    put_row(&o, "  requested %s, rounding %s, split remainders %s,",
            human_bytes(w->requested_bytes, t1, sizeof t1),
            human_bytes(w->rounding_bytes, t2, sizeof t2),
            human_bytes(w->split_remainder_bytes, t3, sizeof t3));
    put_row(&o, "  idle cached segments %s, waiting for streams %s, fragmentation %.1f%%",
            human_bytes(w->idle_cached_bytes, t1, sizeof t1),
            human_bytes(w->pending_bytes, t2, sizeof t2), 100.0 * w->fragmentation);
    put_rule(&o, '-');
    put_row(&o, "Backend calls %" PRIu64 ": %" PRIu64 " reserves, %" PRIu64 " releases, %" PRIu64
                " events recorded",
            s->num_backend_calls, s->num_device_alloc, s->num_device_free, s->num_event_records);
    put_row(&o, "Cache hits %" PRIu64 ", misses %" PRIu64 ", rejected frees %" PRIu64,
            s->num_cache_hits, s->num_cache_misses, s->num_invalid_frees);
    put_row(&o, "Quick-list hits %" PRIu64 ", flushes %" PRIu64, s->num_quick_hits,
            s->num_quick_flushes);
    /* A release count that keeps growing in a loop is a cudaFree and a
     * cudaMalloc per step; kept segments stop it (docs/design.md, growth policy). */
    if (s->num_idle_releases || s->num_idle_keeps)
        put_row(&o, "Idle segments released to grow %" PRIu64 ", kept instead %" PRIu64,
                s->num_idle_releases, s->num_idle_keeps);
    /* Page-mapped pools only: a map count that keeps growing in a loop is
     * remapping (docs/design.md, adaptive allowance). */
    if (s->num_map_calls || s->num_unmap_calls || s->num_vmm_allowance_raises)
        put_row(&o, "Page maps %" PRIu64 ", unmaps %" PRIu64 ", allowance raises %" PRIu64,
                s->num_map_calls, s->num_unmap_calls, s->num_vmm_allowance_raises);
    /* What the device waited for: a synchronize drains every stream's queue,
     * an event wait (before a remap) only the work before one event. */
    if (s->num_sync_all_streams || s->num_event_waits)
        put_row(&o, "Device synchronizes %" PRIu64 ", event waits %" PRIu64,
                s->num_sync_all_streams, s->num_event_waits);
    /* The planned layer (docs/planned.md): what its arena served. */
    if (s->num_plans || s->arena_bytes || s->num_planned_hits) {
        put_row(&o, "Planned steps: %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
                    " re-alignments, %" PRIu64 " to the pool",
                s->num_planned_hits, s->num_planned_misses, s->num_planned_realignments,
                s->num_planned_fallbacks);
        put_row(&o, "  plans %" PRIu64 " (dropped %" PRIu64 ", %.3f ms planning), arena %s"
                    ", peak use %s",
                s->num_plans, s->num_plans_dropped, (double)s->planning_ns / 1e6,
                human_bytes(s->arena_bytes, t1, sizeof t1),
                human_bytes(s->arena_peak_bytes, t2, sizeof t2));
    }
    put_rule(&o, '-');
    put_row(&o, "%-24s | %12s | %12s | %12s | %12s", "Request size class", "Requests",
            "Cache hits", "Misses", "Live (peak)");
    for (unsigned c = 0; c < STOW_SIZE_CLASS_COUNT; c++) {
        const stow_size_class_stats_t *sc = &s->size_class[c];
        if (!sc->requests && !sc->live)
            continue;
        char label[48], live[32];
        uint64_t hi = (uint64_t)512 << c;
        if (c + 1 == STOW_SIZE_CLASS_COUNT)
            snprintf(label, sizeof label, "> %s", human_bytes(hi / 2, t1, sizeof t1));
        else
            snprintf(label, sizeof label, "<= %s", human_bytes(hi, t1, sizeof t1));
        snprintf(live, sizeof live, "%" PRIu64 " (%" PRIu64 ")", sc->live, sc->live_peak);
        put_row(&o, "%-24s | %12" PRIu64 " | %12" PRIu64 " | %12" PRIu64 " | %12s", label,
                sc->requests, sc->hits, sc->misses, live);
    }
    put_rule(&o, '=');
    return finish(&o);
}

size_t stow_stats_json(const stow_stats_t *s, char *buf, size_t buf_len)
{
    out_buf_t o = {buf, buf_len, 0};
    if (!s)
        return finish(&o);
    put(&o, "{\"version\": %u", s->version);
#define JSON_ARRAY_(name, label)                                                             \
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++)                                           \
        put(&o,                                                                              \
            ", \"" #name ".%s.current\": %" PRIu64 ", \"" #name ".%s.peak\": %" PRIu64       \
            ", \"" #name ".%s.allocated\": %" PRIu64 ", \"" #name ".%s.freed\": %" PRIu64,   \
            pool_kind_key[k], s->name[k].current, pool_kind_key[k], s->name[k].peak,         \
            pool_kind_key[k], s->name[k].allocated, pool_kind_key[k], s->name[k].freed);
    STOW_STAT_ARRAY_FIELDS(JSON_ARRAY_)
#undef JSON_ARRAY_
#define JSON_COUNTER_(name, desc) put(&o, ", \"" #name "\": %" PRIu64, s->name);
    STOW_COUNTER_FIELDS(JSON_COUNTER_)
#undef JSON_COUNTER_
    put(&o, ", \"max_split_size\": %" PRIu64 ", \"free_reserved_bytes\": %" PRIu64
            ", \"largest_free_block_bytes\": %" PRIu64,
        s->max_split_size_bytes == UINT64_MAX ? (uint64_t)0 : s->max_split_size_bytes,
        s->free_reserved_bytes, s->largest_free_block_bytes);
    put(&o, ", \"fragmentation\": %.6f, \"fragmentation_peak\": %.6f", s->fragmentation,
        s->fragmentation_peak);
    put(&o, ", \"capacity_bytes\": %" PRIu64 ", \"limit_bytes\": %" PRIu64, s->capacity_bytes,
        s->limit_bytes);
    put(&o, ", \"arena_bytes\": %" PRIu64 ", \"arena_peak_bytes\": %" PRIu64, s->arena_bytes,
        s->arena_peak_bytes);
    const stow_waste_t *w = &s->waste_at_peak;
    put(&o,
        ", \"waste_at_peak.reserved_bytes\": %" PRIu64
        ", \"waste_at_peak.requested_bytes\": %" PRIu64
        ", \"waste_at_peak.rounding_bytes\": %" PRIu64
        ", \"waste_at_peak.split_remainder_bytes\": %" PRIu64
        ", \"waste_at_peak.idle_cached_bytes\": %" PRIu64
        ", \"waste_at_peak.pending_bytes\": %" PRIu64 ", \"waste_at_peak.fragmentation\": %.6f",
        w->reserved_bytes, w->requested_bytes, w->rounding_bytes, w->split_remainder_bytes,
        w->idle_cached_bytes, w->pending_bytes, w->fragmentation);
    for (unsigned c = 0; c < STOW_SIZE_CLASS_COUNT; c++) {
        const stow_size_class_stats_t *sc = &s->size_class[c];
        if (!sc->requests && !sc->live)
            continue;
        put(&o,
            ", \"size_class.%u.requests\": %" PRIu64 ", \"size_class.%u.hits\": %" PRIu64
            ", \"size_class.%u.misses\": %" PRIu64 ", \"size_class.%u.live\": %" PRIu64
            ", \"size_class.%u.live_peak\": %" PRIu64,
            c, sc->requests, c, sc->hits, c, sc->misses, c, sc->live, c, sc->live_peak);
    }
    put(&o, "}");
    return finish(&o);
}
