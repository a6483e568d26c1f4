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
#include "replay/replay_engine.h"
#include "stowage/plan.h"
#include "stowage/trace.h"

static void plan_usage(FILE *f)
{
    fprintf(f, "usage: stowage plan [--capacity BYTES] [--time-limit SECONDS] [--seed N] [--json]\n"
               "                    [-o OUT.csv] FILE | --from-trace TRACE.rep\n"
               "  FILE: CSV with header id,lower,upper,size[,alignment]; lifetimes [lower, upper)\n"
               "  TRACE.rep: allocation trace; event index = time, height compared with peak live\n"
               "  exit 0: a valid plan fits (or no capacity), 1: none found in time, 2: bad input\n");
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
    int from_trace = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--capacity") == 0) {
            if (plan_parse_bytes(v, &capacity) != 0) {
                fprintf(stderr, "stowage plan: --capacity needs a byte count\n");
                return 2;
            }
            i++;
        } else if (strcmp(a, "--time-limit") == 0) {
            char *end = NULL;
            limit = v ? strtod(v, &end) : -1;
            if (v == NULL || end == v || *end != '\0' || !(limit >= 0) || limit > 1e9) {
                fprintf(stderr, "stowage plan: --time-limit needs seconds >= 0\n");
                return 2;
            }
            i++;
        } else if (strcmp(a, "--seed") == 0) {
            if (plan_parse_bytes(v, &seed) != 0) {
                fprintf(stderr, "stowage plan: --seed needs a number\n");
                return 2;
            }
            i++;
        } else if (strcmp(a, "--from-trace") == 0) {
            if (v == NULL || file != NULL) {
                fprintf(stderr, "stowage plan: --from-trace needs one trace file\n");
                return 2;
            }
            file = v;
            from_trace = 1;
            i++;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            if (v == NULL) {
                fprintf(stderr, "stowage plan: -o needs a file name\n");
                return 2;
            }
            out_path = v;
            i++;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            plan_usage(stdout);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "stowage plan: unknown option '%s'\n", a);
            plan_usage(stderr);
            return 2;
        } else if (file != NULL) {
            fprintf(stderr, "stowage plan: only one FILE\n");
            return 2;
        } else {
            file = a;
        }
    }
    if (file == NULL) {
        plan_usage(stderr);
        return 2;
    }
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
        fprintf(stderr, "%s\n", err[0] ? err : stow_strerror(rc));
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
        fprintf(stderr, "%s: %s\n", file, stow_strerror(rc));
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
        if (stow_plan_write_csv(out_path, &problem, res.offsets) != STOW_OK) {
            fprintf(stderr, "stowage plan: cannot write %s\n", out_path);
            stow_plan_result_free(&res);
            stow_plan_problem_free(&problem);
            return 2;
        }
        wrote = 1;
    }
    double ratio = res.lower_bound ? (double)res.height / (double)res.lower_bound : 1.0;
    if (json) {
        printf("{\"file\":");
        stow__json_string(stdout, file);
        printf(",\"buffers\":%zu,\"lower_bound\":%llu,\"height\":%llu,\"ratio\":%.6f,"
               "\"greedy_height\":%llu,\"capacity\":%llu,\"fits\":%s,\"valid\":%s,"
               "\"optimal\":%s,\"method\":\"%s\",\"seconds\":%.6f",
               res.count, (unsigned long long)res.lower_bound, (unsigned long long)res.height,
               ratio, (unsigned long long)res.greedy_height, capacity,
               res.fits ? "true" : "false", valid ? "true" : "false",
               res.optimal ? "true" : "false", res.method, res.seconds);
        if (from_trace)
            printf(",\"trace\":true,\"peak_live_bytes\":%llu,\"height_over_peak_live\":%.6f",
                   peak_live, peak_live ? (double)res.height / (double)peak_live : 1.0);
        if (!valid) {
            printf(",\"invalid_reason\":");
            stow__json_string(stdout, why);
        }
        if (wrote) {
            printf(",\"output\":");
            stow__json_string(stdout, out_path);
        }
        printf("}\n");
    } else {
        printf("file:         %s\n", file);
        printf("buffers:      %zu\n", res.count);
        printf("lower bound:  %llu (maximum live load)\n", (unsigned long long)res.lower_bound);
        printf("height:       %llu\n", (unsigned long long)res.height);
        printf("ratio:        %.6f (height / lower bound)%s\n", ratio,
               res.optimal ? ", optimal" : "");
        printf("greedy:       %llu\n", (unsigned long long)res.greedy_height);
        if (from_trace)
            printf("peak live:    %llu (from the trace); height / peak live = %.6f\n", peak_live,
                   peak_live ? (double)res.height / (double)peak_live : 1.0);
        if (capacity != 0)
            printf("capacity:     %llu: %s\n", capacity, res.fits ? "fits" : "DOES NOT FIT");
        else
            printf("capacity:     none\n");
        printf("validator:    %s%s%s\n", valid ? "valid" : "INVALID", valid ? "" : ": ",
               valid ? "" : why);
        printf("method:       %s\n", res.method);
        printf("seconds:      %.3f\n", res.seconds);
        if (wrote)
            printf("plan written: %s\n", out_path);
    }
    int code = valid && res.fits ? 0 : 1;
    stow_plan_result_free(&res);
    stow_plan_problem_free(&problem);
    return code;
}
