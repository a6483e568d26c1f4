/*
 * tests/unit/test_schedule.c: schedule parsing and the exact peak
 * (planner/schedule.c). The issue's example is the anchor; random schedules
 * are checked against a direct op-by-op recomputation.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stowage/plan.h"

static stow_status_t parse(const char *text, stow_schedule_t *s, char *err)
{
    err[0] = '\0';
    return stow_schedule_parse("s.txt", text, strlen(text), s, err, 256);
}

static void expect_error(const char *text, const char *want)
{
    stow_schedule_t s;
    char err[256];
    cr_assert_eq(parse(text, &s, err), STOW_EPARSE, "accepted: %s", text);
    cr_assert_str_eq(err, want);
}

Test(schedule, issue_example)
{
    stow_schedule_t s;
    char err[256];
    cr_assert_eq(stow_schedule_load(STOW_SOURCE_DIR "/tests/data/schedule_example.txt", &s, err,
                                    sizeof err),
                 STOW_OK, "%s", err);
    cr_assert_eq(s.op_count, 7);
    cr_assert_eq(s.tensor_count, 8);
    stow_schedule_peak_t pk;
    cr_assert_eq(stow_schedule_peak(&s, &pk), STOW_OK);
    const uint64_t after[7] = {10, 14, 13, 9, 10, 8, 0};
    const uint64_t during[7] = {10, 18, 19, 22, 19, 15, 8};
    for (size_t k = 0; k < 7; k++) {
        cr_assert_eq(pk.memory_after_op[k], after[k], "op %zu", k);
        cr_assert_eq(pk.memory_during_op[k], during[k], "op %zu", k);
    }
    cr_assert_eq(pk.peak_bytes, 22);
    cr_assert_eq(pk.peak_op, 3);
    cr_assert_str_eq(s.ops[pk.peak_op].name, "o3");
    cr_assert_eq(pk.alive_count, 3);
    cr_assert_str_eq(s.tensors[pk.alive_at_peak[0]].id, "4");
    cr_assert_str_eq(s.tensors[pk.alive_at_peak[1]].id, "2");
    cr_assert_str_eq(s.tensors[pk.alive_at_peak[2]].id, "3");
    stow_schedule_peak_free(&pk);
    stow_schedule_free(&s);
}

Test(schedule, weights_live_from_the_start_and_unused_tensors_cost_nothing)
{
    stow_schedule_t s;
    char err[256];
    cr_assert_eq(parse("tensor w 100 weight\ntensor x 1 input\ntensor y 2\ntensor unused 1000\n"
                       "op a x y\nop b w,y -\nop c - -\n",
                       &s, err),
                 STOW_OK, "%s", err);
    cr_assert_str_eq(s.tensors[0].name, "weight");
    cr_assert_str_eq(s.tensors[2].name, "");
    stow_schedule_peak_t pk;
    cr_assert_eq(stow_schedule_peak(&s, &pk), STOW_OK);
    /* w is read by b but produced by nobody: alive from op a to op b. x is an
     * input too: alive from the start until a. */
    cr_assert_eq(pk.memory_during_op[0], 103);
    cr_assert_eq(pk.memory_after_op[0], 102);
    cr_assert_eq(pk.memory_during_op[1], 102);
    cr_assert_eq(pk.memory_after_op[1], 0);
    cr_assert_eq(pk.memory_during_op[2], 0);
    cr_assert_eq(pk.peak_bytes, 103);
    cr_assert_eq(pk.peak_op, 0);
    stow_schedule_peak_free(&pk);
    stow_schedule_free(&s);
}

Test(schedule, error_messages_name_file_and_line)
{
    expect_error("tensor a 1\nop x a b\n",
                 "s.txt:2: unknown tensor 'b' (declare it with a 'tensor' line first)");
    expect_error("tensor a 1\n\nop x - a\nop y - a\n",
                 "s.txt:4: tensor 'a' already produced by the op on line 3");
    expect_error("tensor a 1\ntensor b 1\nop x a b\nop y - a\n",
                 "s.txt:4: tensor 'a' is read by the op on line 3 before it is produced");
    expect_error("tensor a 1\nop x a a\n",
                 "s.txt:2: tensor 'a' is both an input and an output of one op");
    expect_error("tensor a 1\nop x a,a -\n", "s.txt:2: tensor 'a' listed twice in one op");
    expect_error("tensor a 1\ntensor a 2\n", "s.txt:2: tensor 'a' declared twice (first on line 1)");
    expect_error("tensor a x1\n", "s.txt:1: bytes 'x1' is not a decimal number");
    expect_error("tensor a 18446744073709551616\n",
                 "s.txt:1: bytes '18446744073709551616' is beyond 2^64 - 1");
    expect_error("tensor a\n",
                 "s.txt:1: the line ends before its <bytes>: expected 'tensor <id> <bytes> "
                 "[name]'");
    expect_error("tensor a 1 n extra\n", "s.txt:1: expected 'tensor <id> <bytes> [name]'");
    expect_error("tensor a,b 1\n", "s.txt:1: tensor id 'a,b' may not contain ',' or be '-'");
    expect_error("# c\nop x -\n",
                 "s.txt:2: the line ends before its <outputs|->: expected 'op <name> <inputs|-> "
                 "<outputs|->' (ids comma-separated)");
    expect_error("op x - - y\n",
                 "s.txt:1: expected 'op <name> <inputs|-> <outputs|->' (ids comma-separated)");
    expect_error("tensor a 1\nop x a, -\n", "s.txt:2: empty tensor id in input list");
    expect_error("layer x\n", "s.txt:1: unknown directive 'layer' (expected 'tensor' or 'op')");
}

/* Each way a field can be wrong has its own reason. */
Test(schedule, field_errors_name_the_field_and_the_reason)
{
    expect_error("tensor a -5\n", "s.txt:1: bytes '-5' is negative");
    expect_error("tensor a 99999999999999999999999 big\n",
                 "s.txt:1: bytes '99999999999999999999999' is beyond 2^64 - 1");
    expect_error("tensor a 1.5\n", "s.txt:1: bytes '1.5' is not a decimal number");
    expect_error("tensor\n",
                 "s.txt:1: the line ends before its <id>: expected 'tensor <id> <bytes> [name]'");
    expect_error("op\n", "s.txt:1: the line ends before its <name>: expected 'op <name> "
                         "<inputs|-> <outputs|->' (ids comma-separated)");
    expect_error("op x\n", "s.txt:1: the line ends before its <inputs|->: expected 'op <name> "
                           "<inputs|-> <outputs|->' (ids comma-separated)");
}

Test(schedule, directory_is_not_a_schedule_file)
{
    char dir[] = "/tmp/stow_schedule_dir_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    stow_schedule_t s;
    char err[512], want[600];
    cr_assert_eq(stow_schedule_load(dir, &s, err, sizeof err), STOW_EIO);
    snprintf(want, sizeof want, "%s: is a directory, not a schedule file", dir);
    cr_assert_str_eq(err, want);
    rmdir(dir);
}

Test(schedule, overflow_is_reported)
{
    stow_schedule_t s;
    char err[256];
    cr_assert_eq(parse("tensor a 18446744073709551615\ntensor b 1\nop x - a\nop y a b\n", &s, err),
                 STOW_OK, "%s", err);
    stow_schedule_peak_t pk;
    cr_assert_eq(stow_schedule_peak(&s, &pk), STOW_EOVERFLOW);
    stow_schedule_free(&s);
    cr_assert_eq(parse("tensor a 18446744073709551615\ntensor b 1\nop x - a\nop y - b\n", &s, err),
                 STOW_OK);
    cr_assert_eq(stow_schedule_peak(&s, &pk), STOW_OK); /* a is freed before b appears */
    cr_assert_eq(pk.peak_bytes, UINT64_MAX);
    stow_schedule_peak_free(&pk);
    stow_schedule_free(&s);
}

Test(schedule, empty_schedule)
{
    stow_schedule_t s;
    char err[256];
    cr_assert_eq(parse("# nothing\n\n", &s, err), STOW_OK);
    stow_schedule_peak_t pk;
    cr_assert_eq(stow_schedule_peak(&s, &pk), STOW_OK);
    cr_assert_eq(pk.peak_bytes, 0);
    cr_assert_eq(pk.alive_count, 0);
    stow_schedule_peak_free(&pk);
    stow_schedule_free(&s);
    stow_schedule_free(NULL);
    stow_schedule_peak_free(NULL);
}

static uint64_t rs = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

Test(schedule, random_schedules_match_direct_recount)
{
    for (int iter = 0; iter < 300; iter++) {
        size_t nt = 1 + rnd() % 12, no = 1 + rnd() % 10;
        char text[4096];
        size_t len = 0;
        uint64_t bytes[12];
        for (size_t t = 0; t < nt; t++) {
            bytes[t] = rnd() % 100;
            len += (size_t)snprintf(text + len, sizeof text - len, "tensor t%zu %llu\n", t,
                                    (unsigned long long)bytes[t]);
        }
        /* Each tensor gets a producer op (or none: a weight); readers come later. */
        int prod[12];
        for (size_t t = 0; t < nt; t++)
            prod[t] = (rnd() % 4 == 0) ? -1 : (int)(rnd() % no);
        bool reads[10][12] = {{false}};
        for (size_t k = 0; k < no; k++)
            for (size_t t = 0; t < nt; t++)
                if ((int)k > prod[t] && rnd() % 3 == 0)
                    reads[k][t] = true;
        for (size_t k = 0; k < no; k++) {
            len += (size_t)snprintf(text + len, sizeof text - len, "op k%zu ", k);
            int first = 1;
            for (size_t t = 0; t < nt; t++)
                if (reads[k][t]) {
                    len += (size_t)snprintf(text + len, sizeof text - len, "%st%zu",
                                            first ? "" : ",", t);
                    first = 0;
                }
            len += (size_t)snprintf(text + len, sizeof text - len, "%s ", first ? "-" : "");
            first = 1;
            for (size_t t = 0; t < nt; t++)
                if (prod[t] == (int)k) {
                    len += (size_t)snprintf(text + len, sizeof text - len, "%st%zu",
                                            first ? "" : ",", t);
                    first = 0;
                }
            len += (size_t)snprintf(text + len, sizeof text - len, "%s\n", first ? "-" : "");
        }
        stow_schedule_t s;
        char err[256];
        cr_assert_eq(parse(text, &s, err), STOW_OK, "%s\n%s", err, text);
        stow_schedule_peak_t pk;
        cr_assert_eq(stow_schedule_peak(&s, &pk), STOW_OK);
        uint64_t peak = 0;
        for (size_t k = 0; k < no; k++) {
            uint64_t during = 0, after = 0;
            for (size_t t = 0; t < nt; t++) {
                int last = -1;
                for (size_t j = 0; j < no; j++)
                    if (reads[j][t])
                        last = (int)j;
                int start = prod[t] >= 0 ? prod[t] : (last >= 0 ? 0 : -1);
                int end = last > prod[t] ? last : prod[t];
                if (start < 0)
                    continue;
                if (start <= (int)k && (int)k <= end)
                    during += bytes[t];
                if (start <= (int)k && (int)k < end)
                    after += bytes[t];
            }
            cr_assert_eq(pk.memory_during_op[k], during, "iter %d op %zu\n%s", iter, k, text);
            cr_assert_eq(pk.memory_after_op[k], after, "iter %d op %zu\n%s", iter, k, text);
            if (during > peak)
                peak = during;
        }
        cr_assert_eq(pk.peak_bytes, peak);
        uint64_t sum = 0;
        for (size_t j = 0; j < pk.alive_count; j++) {
            sum += s.tensors[pk.alive_at_peak[j]].bytes;
            if (j > 0)
                cr_assert_geq(s.tensors[pk.alive_at_peak[j - 1]].bytes,
                              s.tensors[pk.alive_at_peak[j]].bytes);
        }
        cr_assert_eq(sum, peak);
        stow_schedule_peak_free(&pk);
        stow_schedule_free(&s);
    }
}
