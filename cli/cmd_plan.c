/*
 * cli/cmd_plan.c: `stowage plan`, the offline planner on a CSV of buffers.
 *
 * The validator always runs on the plan, independently of the solver, so a
 * printed "valid" never rests on the solver's own word.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "planner/plan_internal.h"
#include "replay/replay_engine.h"
#include "stowage/plan.h"
#include "stowage/trace.h"

static void plan_usage(FILE *f)
{
    fprintf(f, "usage: stowage plan [--capacity BYTES] [--time-limit SECONDS] [--seed N] [--json]\n"
               "                    [-o OUT.csv] FILE | --from-trace TRACE.rep\n"
               "  FILE: CSV with header id,lower,upper,size[,alignment]; lifetimes [lower, upper)\n"
               "  TRACE.rep: allocation trace; event index = time, height compared with peak live\n"
               "  -o OUT.csv: the plan as CSV, id,lower,upper,size[,alignment],offset ('-':\n"
               "  standard output, the summary then goes to standard error). Without -o the\n"
               "  summary is followed by the same columns as a table (with --json, the JSON\n"
               "  line alone: give -o for the offsets)\n"
               "  exit 0: a valid plan fits (or no capacity), 1: no valid plan within the\n"
               "  capacity found in time, 2: bad usage or input\n");
}

/* The offsets as a table with the columns of the CSV, ids left-aligned. */
static void print_offsets(FILE *f, const stow_plan_problem_t *problem, const uint64_t *offsets)
{
    int aligned = stow__plan_has_alignment(problem), w = 2;
    char idbuf[32];
    for (size_t i = 0; i < problem->count; i++) {
        const char *id = problem->buffers[i].id;
        size_t n = id ? strlen(id) : (size_t)snprintf(idbuf, sizeof idbuf, "%zu", i);
        if ((int)n > w)
            w = n > 40 ? 40 : (int)n;
    }
    fprintf(f, "%-*s %20s %20s %20s", w, "id", "lower", "upper", "size");
    if (aligned)
        fprintf(f, " %20s", "alignment");
    fprintf(f, " %20s\n", "offset");
    for (size_t i = 0; i < problem->count; i++) {
        const stow_plan_buffer_t *b = &problem->buffers[i];
        if (b->id)
            fprintf(f, "%-*s", w, b->id);
        else
            fprintf(f, "%-*zu", w, i);
        fprintf(f, " %20llu %20llu %20llu", (unsigned long long)b->lower,
                (unsigned long long)b->upper, (unsigned long long)b->size);
        if (aligned)
            fprintf(f, " %20llu", (unsigned long long)b->alignment);
        fprintf(f, " %20llu\n", (unsigned long long)offsets[i]);
    }
}

/* Decimal with an optional binary suffix K, M, G, T (1K = 1024). */
static int plan_parse_bytes(const char *s, unsigned long long *out)
{
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return -1;
    unsigned shift = 0;
    if (*end != '\0') {
        const char *suf = strchr("KMGT", end[0] & ~0x20);
        if (suf == NULL || end[1] != '\0')
            return -1;
        shift = 10u * (unsigned)(suf - "KMGT" + 1);
    }
    if (shift != 0 && v > (~0ull >> shift))
        return -1;
    *out = v << shift;
    return 0;
}

int stow__cli_plan(int argc, char **argv)
{
    unsigned long long capacity = 0;
    double limit = 10.0;
    unsigned long long seed = 1;
    int json = 0;
    const char *out_path = NULL, *file = NULL;
    int from_trace = 0, have_capacity = 0, have_limit = 0, have_seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes_value = strcmp(a, "--capacity") == 0 || strcmp(a, "--time-limit") == 0 ||
                          strcmp(a, "--seed") == 0 || strcmp(a, "--from-trace") == 0 ||
                          strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0;
        if (takes_value && v == NULL)
            return stow__cli_usage_error("plan", "option '%s' needs a value", a);
        if ((strcmp(a, "--capacity") == 0 && have_capacity) ||
            (strcmp(a, "--time-limit") == 0 && have_limit) ||
            (strcmp(a, "--seed") == 0 && have_seed) ||
            ((strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) && out_path != NULL))
            return stow__cli_usage_error("plan", "%s given twice", a);
        if (strcmp(a, "--capacity") == 0) {
            if (plan_parse_bytes(v, &capacity) != 0)
                return stow__cli_usage_error("plan", "--capacity: '%s' is not a byte count", v);
            have_capacity = 1;
            i++;
        } else if (strcmp(a, "--time-limit") == 0) {
            char *end = NULL;
            limit = strtod(v, &end);
            if (end == v || *end != '\0' || !(limit >= 0) || limit > 1e9)
                return stow__cli_usage_error("plan", "--time-limit: '%s' is not seconds >= 0", v);
            have_limit = 1;
            i++;
        } else if (strcmp(a, "--seed") == 0) {
            if (plan_parse_bytes(v, &seed) != 0)
                return stow__cli_usage_error("plan", "--seed: '%s' is not a number", v);
            have_seed = 1;
            i++;
        } else if (strcmp(a, "--from-trace") == 0) {
            if (file != NULL)
                return stow__cli_usage_error("plan", "--from-trace and FILE: give one input");
            file = v;
            from_trace = 1;
            i++;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            out_path = v;
            i++;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            plan_usage(stdout);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0') {
            return stow__cli_usage_error("plan", "unknown option '%s'", a);
        } else if (file != NULL) {
            return stow__cli_usage_error("plan", "one input only ('%s' and '%s')", file, a);
        } else {
            file = a;
        }
    }
    if (file == NULL)
        return stow__cli_usage_error("plan", "no input: give a CSV FILE or --from-trace TRACE.rep");
    if (json && stow__cli_is_stdout(out_path))
        return stow__cli_usage_error("plan", "--json and -o - both write standard output: give "
                                             "-o a file name");
    struct timespec started;
    clock_gettime(CLOCK_MONOTONIC, &started);
    char err[512] = "";
    stow_plan_problem_t problem;
    stow_status_t rc;
    unsigned long long peak_live = 0;
    if (from_trace) {
        stow_trace_t *trace = NULL;
        rc = stow_trace_load(file, &trace, err, sizeof err);
        if (rc == STOW_OK) {
            peak_live = trace->peak_live_bytes;
            rc = stow_plan_problem_from_trace(trace, &problem);
            stow_trace_free(trace);
        }
    } else {
        rc = stow_plan_load_csv(file, &problem, err, sizeof err);
    }
    if (rc != STOW_OK) {
        fprintf(stderr, "stowage plan: %s\n", err[0] ? err : stow_strerror(rc));
        return 2;
    }
    stow_plan_options_t opts = stow_plan_options_default();
    opts.capacity = capacity;
    /* The limit covers the whole command: reading a 60k-line file is not free. */
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double spent = (double)(now.tv_sec - started.tv_sec) +
                   (double)(now.tv_nsec - started.tv_nsec) * 1e-9;
    /* 3% is kept for the validator and the output (Y_1: about 0.1 s). */
    double budget = limit * 0.97 - spent;
    opts.time_limit_seconds = limit > 0 ? (budget > 0.001 ? budget : 0.001) : 0;
    opts.seed = seed;
    stow_plan_result_t res;
    rc = stow_plan_solve(&problem, &opts, &res);
    if (rc != STOW_OK) {
        fprintf(stderr, "stowage plan: %s: %s\n", file, stow_strerror(rc));
        stow_plan_problem_free(&problem);
        return 2;
    }
    char why[512] = "";
    int valid = stow_plan_validate(&problem, res.offsets, capacity, why, sizeof why) == STOW_OK;
    /* A plan over the capacity is still checked for overlaps, so that the
     * verdict says which of the two is wrong. */
    if (!valid && !res.fits)
        valid = stow_plan_validate(&problem, res.offsets, 0, why, sizeof why) == STOW_OK;
    int wrote = 0;
    if (out_path != NULL) {
        FILE *f = stow__cli_open_out(out_path, "w");
        int bad = f == NULL || stow__plan_write_csv_to(f, &problem, res.offsets) != STOW_OK;
        if (f != NULL && stow__cli_close_out(f) != 0)
            bad = 1;
        if (bad) {
            fprintf(stderr, "stowage plan: cannot write %s\n", out_path);
            stow_plan_result_free(&res);
            stow_plan_problem_free(&problem);
            return 2;
        }
        wrote = 1;
    }
    /* With the plan on standard output, the summary goes to standard error. */
    FILE *out = stow__cli_is_stdout(out_path) ? stderr : stdout;
    double ratio = res.lower_bound ? (double)res.height / (double)res.lower_bound : 1.0;
    if (json) {
        fprintf(out, "{\"file\":");
        stow__json_string(out, file);
        fprintf(out, ",\"buffers\":%zu,\"lower_bound\":%llu,\"height\":%llu,\"ratio\":%.6f,"
                "\"greedy_height\":%llu,\"capacity\":%llu,\"fits\":%s,\"valid\":%s,"
                "\"optimal\":%s,\"method\":\"%s\",\"seconds\":%.6f",
                res.count, (unsigned long long)res.lower_bound, (unsigned long long)res.height,
                ratio, (unsigned long long)res.greedy_height, capacity,
                res.fits ? "true" : "false", valid ? "true" : "false",
                res.optimal ? "true" : "false", res.method, res.seconds);
        if (from_trace)
            fprintf(out, ",\"trace\":true,\"peak_live_bytes\":%llu,\"height_over_peak_live\":%.6f",
                    peak_live, peak_live ? (double)res.height / (double)peak_live : 1.0);
        if (!valid) {
            fprintf(out, ",\"invalid_reason\":");
            stow__json_string(out, why);
        }
        if (wrote) {
            fprintf(out, ",\"output\":");
            stow__json_string(out, out_path);
        }
        fprintf(out, "}\n");
    } else {
        fprintf(out, "file:         %s\n", file);
        fprintf(out, "buffers:      %zu\n", res.count);
        fprintf(out, "lower bound:  %llu (maximum live load)\n",
                (unsigned long long)res.lower_bound);
        fprintf(out, "height:       %llu\n", (unsigned long long)res.height);
        fprintf(out, "ratio:        %.6f (height / lower bound)%s\n", ratio,
                res.optimal ? ", optimal" : "");
        fprintf(out, "greedy:       %llu\n", (unsigned long long)res.greedy_height);
        if (from_trace)
            fprintf(out, "peak live:    %llu (from the trace); height / peak live = %.6f\n",
                    peak_live, peak_live ? (double)res.height / (double)peak_live : 1.0);
        if (capacity != 0)
            fprintf(out, "capacity:     %llu: %s\n", capacity, res.fits ? "fits" : "DOES NOT FIT");
        else
            fprintf(out, "capacity:     none\n");
        fprintf(out, "validator:    %s%s%s\n", valid ? "valid" : "INVALID", valid ? "" : ": ",
                valid ? "" : why);
        fprintf(out, "method:       %s\n", res.method);
        fprintf(out, "seconds:      %.3f\n", res.seconds);
        if (wrote)
            fprintf(out, "plan written: %s\n",
                    stow__cli_is_stdout(out_path) ? "standard output" : out_path);
    }
    if (out_path == NULL && !json) {
        fprintf(out, "\n");
        print_offsets(out, &problem, res.offsets);
    }
    int code = valid && res.fits ? 0 : 1;
    stow_plan_result_free(&res);
    stow_plan_problem_free(&problem);
    return code;
}
