/*
 * cli/cmd_peak.c: `stowage peak`, the exact memory peak of an operator schedule
 * and the budget it implies.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "replay/replay_engine.h"
#include "stowage/plan.h"

static void peak_usage(FILE *f)
{
    fprintf(f, "usage: stowage peak [--alpha A] [--capacity BYTES] [--json] FILE\n"
               "  FILE lines: 'tensor <id> <bytes> [name]' and\n"
               "              'op <name> <inputs|-> <outputs|->' in execution order\n"
               "  budget = ceil(peak * (1 + A)), A = 0.2 by default; BYTES may end in K, M, G\n"
               "  or T (powers of 1024)\n"
               "  exit 0: fits (or no capacity), 1: budget exceeds capacity, 2: bad usage or\n"
               "  input\n");
}

/* Alpha is read as an exact decimal num / 10^k so that budgets are exact:
 * in binary floating point 10 x 1.2 is slightly above 12 and would round up
 * to 13. */
static int peak_parse_alpha(const char *s, unsigned long long *num, unsigned long long *den)
{
    unsigned long long n = 0, d = 1;
    int digits = 0, frac = -1;
    if (s == NULL)
        return -1;
    for (; *s; s++) {
        if (*s == '.' && frac < 0) {
            frac = 0;
            continue;
        }
        if (*s < '0' || *s > '9' || n > 100000000000ull)
            return -1;
        n = n * 10 + (unsigned long long)(*s - '0');
        digits++;
        if (frac >= 0 && ++frac > 9)
            return -1;
        if (frac > 0)
            d *= 10;
    }
    if (digits == 0)
        return -1;
    *num = n;
    *den = d;
    return 0;
}

__extension__ typedef unsigned __int128 peak_u128;

int stow__cli_peak(int argc, char **argv)
{
    double alpha = 0.2;
    unsigned long long alpha_num = 2, alpha_den = 10;
    unsigned long long capacity = 0;
    int have_capacity = 0, json = 0;
    const char *file = NULL;
    int have_alpha = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if ((strcmp(a, "--alpha") == 0 || strcmp(a, "--capacity") == 0) && v == NULL)
            return stow__cli_usage_error("peak", "option '%s' needs a value", a);
        if ((strcmp(a, "--alpha") == 0 && have_alpha) ||
            (strcmp(a, "--capacity") == 0 && have_capacity))
            return stow__cli_usage_error("peak", "%s given twice", a);
        if (strcmp(a, "--alpha") == 0) {
            if (peak_parse_alpha(v, &alpha_num, &alpha_den) != 0)
                return stow__cli_usage_error("peak", "--alpha: '%s' is not a decimal >= 0 (at "
                                                     "most 9 fractional digits)",
                                             v);
            alpha = (double)alpha_num / (double)alpha_den;
            have_alpha = 1;
            i++;
        } else if (strcmp(a, "--capacity") == 0) {
            size_t bytes;
            if (!stow__replay_parse_bytes(v, &bytes))
                return stow__cli_usage_error("peak", "--capacity: '%s' is not a byte count", v);
            capacity = bytes;
            have_capacity = 1;
            i++;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            peak_usage(stdout);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0') {
            return stow__cli_usage_error("peak", "unknown option '%s'", a);
        } else if (file != NULL) {
            return stow__cli_usage_error("peak", "one FILE only ('%s' and '%s')", file, a);
        } else {
            file = a;
        }
    }
    if (file == NULL)
        return stow__cli_usage_error("peak", "no FILE given (an op schedule)");
    char err[512] = "";
    stow_schedule_t s;
    stow_status_t rc = stow_schedule_load(file, &s, err, sizeof err);
    if (rc != STOW_OK) {
        fprintf(stderr, "stowage peak: %s\n", err[0] ? err : stow_strerror(rc));
        return 2;
    }
    stow_schedule_peak_t pk;
    rc = stow_schedule_peak(&s, &pk);
    if (rc != STOW_OK) {
        fprintf(stderr, "stowage peak: %s: %s\n", file, stow_strerror(rc));
        stow_schedule_free(&s);
        return 2;
    }
    /* budget = peak + ceil(peak * num / den), exact in 128 bits; a budget beyond
     * 64 bits saturates (and then never fits). */
    peak_u128 extra = ((peak_u128)pk.peak_bytes * alpha_num + alpha_den - 1) / alpha_den;
    peak_u128 total = (peak_u128)pk.peak_bytes + extra;
    unsigned long long budget = total > (peak_u128)~0ull ? ~0ull : (unsigned long long)total;
    int fits = !have_capacity || budget <= capacity;
    const char *peak_name = pk.op_count ? s.ops[pk.peak_op].name : "";
    if (json) {
        printf("{\"file\":");
        stow__json_string(stdout, file);
        printf(",\"ops\":%zu,\"tensors\":%zu,\"peak_bytes\":%llu,\"peak_op\":", s.op_count,
               s.tensor_count, (unsigned long long)pk.peak_bytes);
        if (pk.op_count)
            stow__json_string(stdout, peak_name);
        else
            printf("null");
        printf(",\"peak_op_index\":%zu,\"memory_during_op\":[", pk.peak_op);
        for (size_t k = 0; k < pk.op_count; k++)
            printf("%s%llu", k ? "," : "", (unsigned long long)pk.memory_during_op[k]);
        printf("],\"memory_after_op\":[");
        for (size_t k = 0; k < pk.op_count; k++)
            printf("%s%llu", k ? "," : "", (unsigned long long)pk.memory_after_op[k]);
        printf("],\"alive_at_peak\":[");
        for (size_t j = 0; j < pk.alive_count; j++) {
            const stow_schedule_tensor_t *t = &s.tensors[pk.alive_at_peak[j]];
            printf("%s{\"id\":", j ? "," : "");
            stow__json_string(stdout, t->id);
            printf(",\"name\":");
            stow__json_string(stdout, t->name);
            printf(",\"bytes\":%llu}", (unsigned long long)t->bytes);
        }
        printf("],\"alpha\":%g,\"budget_bytes\":%llu,\"capacity\":", alpha, budget);
        if (have_capacity)
            printf("%llu,\"fits\":%s}\n", capacity, fits ? "true" : "false");
        else
            printf("null,\"fits\":null}\n");
    } else {
        printf("file: %s (%zu tensors, %zu ops)\n", file, s.tensor_count, s.op_count);
        printf("%6s  %-24s %20s %20s\n", "op", "name", "during", "after");
        for (size_t k = 0; k < pk.op_count; k++)
            printf("%6zu  %-24s %20llu %20llu%s\n", k, s.ops[k].name,
                   (unsigned long long)pk.memory_during_op[k],
                   (unsigned long long)pk.memory_after_op[k], k == pk.peak_op ? "  <- peak" : "");
        if (pk.op_count)
            printf("peak: %llu bytes inside op %s (#%zu, line %zu)\n",
                   (unsigned long long)pk.peak_bytes, peak_name, pk.peak_op,
                   s.ops[pk.peak_op].line);
        else
            printf("peak: 0 bytes (no ops)\n");
        printf("alive at peak, largest first:\n");
        for (size_t j = 0; j < pk.alive_count; j++) {
            const stow_schedule_tensor_t *t = &s.tensors[pk.alive_at_peak[j]];
            printf("  %-16s %-24s %20llu (%5.1f%%)\n", t->id, t->name,
                   (unsigned long long)t->bytes,
                   pk.peak_bytes ? 100.0 * (double)t->bytes / (double)pk.peak_bytes : 0.0);
        }
        printf("budget: %llu bytes (peak x %g)\n", budget, 1.0 + alpha);
        if (have_capacity)
            printf("capacity: %llu: %s\n", capacity, fits ? "fits" : "DOES NOT FIT");
    }
    stow_schedule_peak_free(&pk);
    stow_schedule_free(&s);
    return fits ? 0 : 1;
}
