/*
 * report/report_diff.c: the comparison behind `stowage diff` (contract:
 * report/report.h): headline figures of two traces under one policy, and
 * which size classes and tags hold more bytes at the peak.
 */
#include "report/report.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

stow_status_t stow__diff_side(const stow_trace_t *t, const stow_replay_policy_t *policy,
                              const stow_config_t *config, bool min_capacity,
                              stow_diff_side_t *out)
{
    stow_diff_side_t s;
    memset(&s, 0, sizeof s);
    stow_replay_result_t r;
    stow_status_t st =
        stow__replay_run(policy, t, config, 0, 0, min_capacity && policy->device, NULL, NULL, &r);
    if (st != STOW_OK)
        return st;
    s.peak_live_bytes = t->peak_live_bytes;
    s.peak_reserved_bytes = r.peak_reserved_bytes;
    s.has_min_capacity = r.has_min_capacity;
    s.min_capacity_bytes = r.min_capacity_bytes;
    /* live bytes per class after the peak event: replay the trace up to it */
    unsigned char *live = calloc(t->id_count ? t->id_count : 1, 1);
    if (!live)
        return STOW_EHOSTMEM;
    for (size_t i = 0; i < t->event_count; i++) {
        const stow_trace_event_t *e = &t->events[i];
        unsigned k = stow__report_size_class(e->size_bytes);
        if (e->kind == STOW_TRACE_ALLOC) {
            s.class_count[k]++;
            s.class_bytes[k] += e->size_bytes;
            if (i <= t->peak_live_event)
                live[e->id] = 1;
        } else if (i <= t->peak_live_event) {
            live[e->id] = 0;
        }
    }
    for (size_t i = 0; i <= t->peak_live_event && i < t->event_count; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC && live[e->id])
            s.class_at_peak[stow__report_size_class(e->size_bytes)] += e->size_bytes;
    }
    free(live);
    *out = s;
    return STOW_OK;
}

double stow__diff_pct(uint64_t a, uint64_t b)
{
    if (!a)
        return b ? 100.0 : 0.0;
    return 100.0 * ((double)b - (double)a) / (double)a;
}

static void row(FILE *f, const char *label, uint64_t a, uint64_t b)
{
    fprintf(f, "  %-26s %16" PRIu64 " %16" PRIu64 " %+9.2f%%\n", label, a, b,
            stow__diff_pct(a, b));
}

static void class_name(char *buf, size_t len, unsigned k)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    snprintf(buf, len, "[%llu %s, %llu %s)", 1ull << (k % 10), unit[k / 10],
             (k + 1) % 10 ? 1ull << ((k + 1) % 10) : 1ull, unit[(k + 1) / 10]);
}

bool stow__diff_print(FILE *f, const char *name_a, const char *name_b,
                      const stow_diff_side_t *a, const stow_diff_side_t *b, double threshold_pct,
                      const char *policy)
{
    fprintf(f, "A: %s\nB: %s\n\n  %-26s %16s %16s %10s\n", name_a, name_b, "", "A", "B",
            "change");
    row(f, "peak live bytes", a->peak_live_bytes, b->peak_live_bytes);
    char label[64];
    snprintf(label, sizeof label, "peak reserved (%s)", policy);
    row(f, label, a->peak_reserved_bytes, b->peak_reserved_bytes);
    if (a->has_min_capacity && b->has_min_capacity)
        row(f, "minimum capacity", a->min_capacity_bytes, b->min_capacity_bytes);
    fputs("\nsize classes, live bytes at the peak (changed classes, largest change first):\n", f);
    bool shown[STOW_REPORT_CLASSES] = {false};
    for (unsigned n = 0; n < 12; n++) {
        int best = -1;
        uint64_t best_abs = 0;
        for (unsigned k = 0; k < STOW_REPORT_CLASSES; k++) {
            int64_t d = (int64_t)b->class_at_peak[k] - (int64_t)a->class_at_peak[k];
            uint64_t ad = (uint64_t)(d < 0 ? -d : d);
            if (!shown[k] && ad > best_abs) {
                best_abs = ad;
                best = (int)k;
            }
        }
        if (best < 0)
            break;
        shown[best] = true;
        char name[48];
        class_name(name, sizeof name, (unsigned)best);
        fprintf(f, "  %-26s %16" PRIu64 " %16" PRIu64 " %+9.2f%%  (%" PRIu64 " -> %" PRIu64
                   " allocations in all)\n",
                name, a->class_at_peak[best], b->class_at_peak[best],
                stow__diff_pct(a->class_at_peak[best], b->class_at_peak[best]),
                a->class_count[best], b->class_count[best]);
    }
    double live_pct = stow__diff_pct(a->peak_live_bytes, b->peak_live_bytes);
    double res_pct = stow__diff_pct(a->peak_reserved_bytes, b->peak_reserved_bytes);
    bool regressed = live_pct > threshold_pct || res_pct > threshold_pct;
    fprintf(f, "\n%s: peak live %+.2f%%, peak reserved %+.2f%% (threshold %.2f%%)\n",
            regressed ? "REGRESSION" : "ok", live_pct, res_pct, threshold_pct);
    return regressed;
}
