/*
 * cli/cmd_report.c: `stowage report`, the memory report of one trace: a
 * self-contained HTML page, a JSON line, or the growth analysis as text.
 * Glue between argv and report/report.h only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "report/report.h"

static void report_usage(FILE *f)
{
    fprintf(f,
            "usage: stowage report TRACE [--policy P] [--capacity BYTES] [--min-capacity]\n"
            "                     [--conf S] [-o FILE.html] [--json] [--growth]\n"
            "                     [--iterations N | --boundary EVENT,...] [--tags FILE]\n"
            "                     [--bars N] [--points N]\n"
            "\n"
            "Replays TRACE under a policy (default vmm) and writes one self-contained\n"
            "HTML page: memory over time (live and reserved bytes, peak marked), allocation\n"
            "lifetimes, fragmentation, growth across iterations, the allocations alive at\n"
            "the peak, and the headline figures (docs/report.md).\n"
            "  -o FILE         the page (default report.html; '-': standard output; not\n"
            "                  written with --json or --growth unless -o is given)\n"
            "  --json          one JSON line of headline figures and the growth verdict\n"
            "  --growth        live bytes at each iteration boundary and a leak warning;\n"
            "                  exit 1 when live bytes grow steadily\n"
            "  --iterations N  the trace holds N iterations (else detected)\n"
            "  --boundary E,.. iteration boundaries as event indices\n"
            "  --tags FILE     '<id> <tag>' lines, plain or gzip (default TRACE.tags or\n"
            "                  TRACE.tags.gz, for X.rep.gz also X.rep.tags.gz, when present)\n"
            "  --bars N        lifetimes drawn one by one (default 2000)\n"
            "  --points N      memory-chart buckets (default 4000)\n"
            "  --policy P      a policy of 'stowage replay --help'; default: the pool the\n"
            "                  settings select (vmm, or classic with policy:classic)\n"
            "  --conf S        settings in STOWAGE_CONF syntax (also read from STOWAGE_CONF);\n"
            "                  a key the policy cannot apply is an error naming it\n"
            "Exit status: 0 ok, 1 leak (--growth), 2 bad usage or input.\n");
}

static bool parse_count(const char *s, size_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return false;
    *out = (size_t)v;
    return true;
}

/* Value options, each at most once. */
static const char *const report_value_opts[] = {"--policy", "--conf",   "-o",     "--tags",
                                                "--capacity", "--iterations", "--bars",
                                                "--points", "--boundary"};
#define REPORT_VALUE_OPTS (sizeof report_value_opts / sizeof report_value_opts[0])

int stow__cli_report(int argc, char **argv)
{
    const char *trace_path = NULL, *out_path = NULL, *policy_name = NULL, *conf = NULL;
    const char *tags_path = NULL;
    size_t capacity = 0, iterations = 0;
    bool json = false, growth = false, min_capacity = false;
    bool seen[REPORT_VALUE_OPTS] = {false};
    static size_t given[STOW_REPORT_MAX_BOUNDARIES];
    unsigned given_count = 0;
    stow_html_opts_t hopts = {0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        for (size_t k = 0; k < REPORT_VALUE_OPTS; k++) {
            if (strcmp(a, report_value_opts[k]))
                continue;
            if (!v)
                return stow__cli_usage_error("report", "option '%s' needs a value", a);
            if (seen[k])
                return stow__cli_usage_error("report", "%s given twice", a);
            seen[k] = true;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            report_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--growth")) {
            growth = true;
        } else if (!strcmp(a, "--min-capacity")) {
            min_capacity = true;
        } else if (!strcmp(a, "--policy")) {
            policy_name = v, i++;
        } else if (!strcmp(a, "--conf")) {
            conf = v, i++;
        } else if (!strcmp(a, "-o")) {
            out_path = v, i++;
        } else if (!strcmp(a, "--tags")) {
            tags_path = v, i++;
        } else if (!strcmp(a, "--capacity")) {
            ok = stow__replay_parse_bytes(v, &capacity), i++;
        } else if (!strcmp(a, "--iterations")) {
            ok = parse_count(v, &iterations) && iterations >= 2 &&
                 iterations <= STOW_REPORT_MAX_BOUNDARIES, i++;
        } else if (!strcmp(a, "--bars")) {
            ok = parse_count(v, &hopts.max_bars) && hopts.max_bars > 0, i++;
        } else if (!strcmp(a, "--points")) {
            ok = parse_count(v, &hopts.max_points) && hopts.max_points > 0, i++;
        } else if (!strcmp(a, "--boundary")) {
            char *copy = strdup(v);
            for (char *tok = strtok(copy, ","); ok && tok; tok = strtok(NULL, ",")) {
                size_t e;
                ok = parse_count(tok, &e) && given_count < STOW_REPORT_MAX_BOUNDARIES;
                if (ok)
                    given[given_count++] = e;
            }
            free(copy);
            i++;
        } else if (a[0] == '-' && a[1]) {
            return stow__cli_usage_error("report", "unknown option '%s'", a);
        } else if (!trace_path) {
            trace_path = a;
        } else {
            return stow__cli_usage_error("report", "one trace only ('%s' and '%s')", trace_path,
                                         a);
        }
        if (!ok)
            return stow__cli_usage_error("report", "%s: bad value '%s'", a, v);
    }
    if (!trace_path)
        return stow__cli_usage_error("report", "no trace given");
    /* The page is written with -o, or by default when nothing else is asked. */
    bool page = out_path || (!json && !growth);
    if (stow__cli_is_stdout(out_path) && (json || growth))
        return stow__cli_usage_error("report", "-o - and %s both write standard output: give -o "
                                               "a file name",
                                     json ? "--json" : "--growth");
    if (iterations && given_count)
        return stow__cli_usage_error("report", "--iterations and --boundary both set the "
                                               "iterations: give one");
    if (!page && (hopts.max_bars || hopts.max_points || tags_path))
        return stow__cli_usage_error("report", "%s shapes the HTML page, which %s without -o does "
                                               "not write: add -o FILE.html or drop it",
                                     hopts.max_bars ? "--bars" : hopts.max_points ? "--points"
                                                                                  : "--tags",
                                     json ? "--json" : "--growth");
    const stow_replay_policy_t *policy = &stow__replay_policy_classic;
    if (policy_name && !(policy = stow__replay_policy_find(policy_name)))
        return stow__cli_usage_error("report", "unknown policy '%s'", policy_name);
    stow_config_t config;
    char err[512] = "";
    if (stow__replay_load_config(conf, &config, err, sizeof err) != STOW_OK)
        return stow__cli_usage_error("report", "%s", err);
    unsigned count = 1;
    if (stow__replay_conf_resolve(conf, &config, policy_name != NULL, &policy, &count, stderr,
                                  "stowage report", err, sizeof err) != STOW_OK)
        return stow__cli_usage_error("report", "%s", err);
    if (!policy->device && (capacity || min_capacity))
        return stow__cli_usage_error("report", "%s sets the simulated device; policy %s runs on "
                                               "host memory: drop it or use a device policy",
                                     capacity ? "--capacity" : "--min-capacity", policy->name);
    stow_trace_t *t = NULL;
    if (stow_trace_load(trace_path, &t, err, sizeof err) != STOW_OK) {
        fprintf(stderr, "stowage report: %s\n", err);
        return 2;
    }
    stow__replay_note_no_steps(stderr, "stowage report", t, policy, &config);
    char sidecar[4096];
    if (!tags_path)
        tags_path = stow__cli_tags_beside(trace_path, sidecar, sizeof sidecar);
    const char **tags = NULL;
    if (tags_path && !(tags = stow__report_tags_load(tags_path, t->id_count, err, sizeof err))) {
        fprintf(stderr, "stowage report: %s\n", err);
        stow_trace_free(t);
        return 2;
    }
    stow_report_t r;
    stow_status_t st =
        stow__report_build(t, policy->name, &config, capacity, min_capacity, 2000, &r);
    if (st != STOW_OK) {
        fprintf(stderr, "stowage report: %s: %s\n", trace_path, stow_strerror(st));
        stow__report_tags_free(tags, t->id_count);
        stow_trace_free(t);
        return 2;
    }
    r.tags = tags;
    stow_growth_t *g = malloc(sizeof *g);
    int rc = 0;
    if (!g) {
        rc = 2;
        goto done;
    }
    stow__report_growth(&r, given, given_count, (unsigned)iterations, g);
    if (json)
        stow__report_write_json(stdout, &r, g);
    if (growth) {
        stow__report_growth_print(stdout, &r, g);
        rc = g->leak ? 1 : 0;
    }
    if (page) {
        const char *path = out_path ? out_path : "report.html";
        FILE *f = stow__cli_open_out(path, "w");
        if (!f || stow__report_write_html(f, &r, g, &hopts) != STOW_OK)
            rc = 2;
        if (f && stow__cli_close_out(f) != 0)
            rc = 2;
        if (rc == 2)
            fprintf(stderr, "stowage report: cannot write %s\n", path);
        else if (!json && !growth && !stow__cli_is_stdout(path))
            fprintf(stderr, "wrote %s\n", path);
    }
done:
    free(g);
    stow__report_free(&r);
    stow__report_tags_free(tags, t->id_count);
    stow_trace_free(t);
    return rc;
}
