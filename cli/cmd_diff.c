/*
 * cli/cmd_diff.c: `stowage diff A B`, the memory regression guard: compares
 * peak live and peak reserved bytes (and optionally the minimum capacity) of
 * two traces under one policy, shows which size classes and tags grew, and
 * exits 1 when a peak grew by more than --threshold percent.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "report/report.h"

static void diff_usage(FILE *f)
{
    fprintf(f, "usage: stowage diff A.rep B.rep [--threshold PCT] [--policy P] [--min-capacity]\n"
               "                   [--conf S]\n"
               "\n"
               "Compares trace B with trace A: peak live bytes, peak reserved bytes under\n"
               "the policy (default: the pool the settings select, vmm unless --conf or\n"
               "STOWAGE_CONF says policy:classic), the minimum capacity (--min-capacity),\n"
               "the size classes and tags (A.rep.tags, B.rep.tags) holding more at the peak.\n"
               "A setting the policy cannot apply is an error naming it.\n"
               "Exit status: 0 within the threshold (default 2%%), 1 when peak live or peak\n"
               "reserved grew by more than it, 2 bad usage or input.\n");
}

/* Bytes per tag at the peak of t, as parallel arrays sorted by tag. */
typedef struct tag_sum {
    const char *tag;
    uint64_t bytes;
} tag_sum_t;

static int by_tag(const void *a, const void *b)
{
    return strcmp(((const tag_sum_t *)a)->tag, ((const tag_sum_t *)b)->tag);
}

static size_t tags_at_peak(const stow_trace_t *t, const char **tags, tag_sum_t *out)
{
    unsigned char *live = calloc(t->id_count ? t->id_count : 1, 1);
    uint64_t *size = calloc(t->id_count ? t->id_count : 1, sizeof *size);
    size_t n = 0;
    if (live && size) {
        for (size_t i = 0; i <= t->peak_live_event && i < t->event_count; i++) {
            live[t->events[i].id] = t->events[i].kind == STOW_TRACE_ALLOC;
            size[t->events[i].id] = t->events[i].size_bytes;
        }
        for (uint32_t id = 0; id < t->id_count; id++)
            if (live[id])
                out[n++] = (tag_sum_t){tags[id] ? tags[id] : "(untagged)", size[id]};
        qsort(out, n, sizeof *out, by_tag);
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            if (m && !strcmp(out[m - 1].tag, out[i].tag))
                out[m - 1].bytes += out[i].bytes;
            else
                out[m++] = out[i];
        }
        n = m;
    }
    free(live);
    free(size);
    return n;
}

static void print_tags(const stow_trace_t *ta, const char **ga, const stow_trace_t *tb,
                       const char **gb)
{
    tag_sum_t *a = malloc((ta->id_count + 1) * sizeof *a);
    tag_sum_t *b = malloc((tb->id_count + 1) * sizeof *b);
    if (a && b) {
        size_t na = tags_at_peak(ta, ga, a), nb = tags_at_peak(tb, gb, b);
        printf("\ntags that grew, live bytes at the peak:\n");
        size_t i = 0, j = 0, shown = 0;
        while ((i < na || j < nb) && shown < 20) {
            int c = i >= na ? 1 : j >= nb ? -1 : strcmp(a[i].tag, b[j].tag);
            uint64_t va = c <= 0 ? a[i].bytes : 0, vb = c >= 0 ? b[j].bytes : 0;
            const char *tag = c <= 0 ? a[i].tag : b[j].tag;
            if (vb > va) {
                printf("  %-40s %16" PRIu64 " %16" PRIu64 " %+9.2f%%\n", tag, va, vb,
                       stow__diff_pct(va, vb));
                shown++;
            }
            i += c <= 0;
            j += c >= 0;
        }
        if (!shown)
            printf("  none\n");
    }
    free(a);
    free(b);
}

int stow__cli_diff(int argc, char **argv)
{
    const char *path[2] = {NULL, NULL}, *policy_name = NULL, *conf = NULL;
    double threshold = 2.0;
    bool min_capacity = false, have_threshold = false;
    unsigned paths = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes_value = !strcmp(a, "--policy") || !strcmp(a, "--conf") ||
                           !strcmp(a, "--threshold");
        if (takes_value && !v)
            return stow__cli_usage_error("diff", "option '%s' needs a value", a);
        if ((!strcmp(a, "--policy") && policy_name) || (!strcmp(a, "--conf") && conf) ||
            (!strcmp(a, "--threshold") && have_threshold))
            return stow__cli_usage_error("diff", "%s given twice", a);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            diff_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--min-capacity")) {
            min_capacity = true;
        } else if (!strcmp(a, "--policy")) {
            policy_name = v, i++;
        } else if (!strcmp(a, "--conf")) {
            conf = v, i++;
        } else if (!strcmp(a, "--threshold")) {
            char *end;
            errno = 0;
            threshold = strtod(v, &end);
            if (errno || end == v || *end || !(threshold >= 0))
                return stow__cli_usage_error("diff", "--threshold: '%s' is not a percentage >= 0",
                                             v);
            have_threshold = true;
            i++;
        } else if (a[0] == '-' && a[1]) {
            return stow__cli_usage_error("diff", "unknown option '%s'", a);
        } else if (paths < 2) {
            path[paths++] = a;
        } else {
            return stow__cli_usage_error("diff", "two traces only ('%s' is a third)", a);
        }
    }
    if (paths != 2)
        return stow__cli_usage_error("diff", "two traces needed, A.rep and B.rep (%u given)",
                                     paths);
    const stow_replay_policy_t *policy = &stow__replay_policy_classic;
    if (policy_name && !(policy = stow__replay_policy_find(policy_name)))
        return stow__cli_usage_error("diff", "unknown policy '%s'", policy_name);
    stow_config_t config;
    char err[512] = "";
    if (stow__replay_load_config(conf, &config, err, sizeof err) != STOW_OK)
        return stow__cli_usage_error("diff", "%s", err);
    unsigned count = 1;
    if (stow__replay_conf_resolve(conf, &config, policy_name != NULL, &policy, &count, stderr,
                                  "stowage diff", err, sizeof err) != STOW_OK)
        return stow__cli_usage_error("diff", "%s", err);
    if (min_capacity && !policy->device)
        return stow__cli_usage_error("diff", "--min-capacity searches the simulated device; "
                                             "policy %s runs on host memory: drop it or use a "
                                             "device policy",
                                     policy->name);
    stow_trace_t *t[2] = {NULL, NULL};
    const char **tags[2] = {NULL, NULL};
    stow_diff_side_t side[2];
    int rc = 0;
    for (unsigned k = 0; k < 2 && rc == 0; k++) {
        if (stow_trace_load(path[k], &t[k], err, sizeof err) != STOW_OK) {
            fprintf(stderr, "stowage diff: %s\n", err);
            rc = 2;
            break;
        }
        stow__replay_note_no_steps(stderr, "stowage diff", t[k], policy, &config);
        stow_status_t st = stow__diff_side(t[k], policy, &config, min_capacity, &side[k]);
        if (st != STOW_OK) {
            fprintf(stderr, "stowage diff: %s: %s\n", path[k], stow_strerror(st));
            rc = 2;
            break;
        }
        char buf[4096];
        const char *sidecar = stow__cli_tags_beside(path[k], buf, sizeof buf);
        if (sidecar &&
            !(tags[k] = stow__report_tags_load(sidecar, t[k]->id_count, err, sizeof err))) {
            fprintf(stderr, "stowage diff: %s\n", err);
            rc = 2;
        }
    }
    if (rc == 0) {
        rc = stow__diff_print(stdout, path[0], path[1], &side[0], &side[1], threshold,
                              policy->name)
                 ? 1
                 : 0;
        if (tags[0] || tags[1]) {
            const char **ga = tags[0], **gb = tags[1];
            const char **ea = calloc(t[0]->id_count + 1, sizeof *ea);
            const char **eb = calloc(t[1]->id_count + 1, sizeof *eb);
            if (ea && eb)
                print_tags(t[0], ga ? ga : ea, t[1], gb ? gb : eb);
            free(ea);
            free(eb);
        }
    }
    for (unsigned k = 0; k < 2; k++) {
        if (t[k])
            stow__report_tags_free(tags[k], t[k]->id_count);
        stow_trace_free(t[k]);
    }
    return rc;
}
