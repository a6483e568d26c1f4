/*
 * tests/unit/test_diff.c: `stowage diff` (report/report.h): size classes,
 * percentages, the figures of one side, and the exit status of the built CLI
 * (0 within the threshold, 1 regression, 2 bad input). No timing asserted.
 */
#include <criterion/criterion.h>

#include "test_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "report/report.h"

Test(diff, size_classes_and_pct)
{
    cr_assert_eq(stow__report_size_class(1), 0);
    cr_assert_eq(stow__report_size_class(1023), 9);
    cr_assert_eq(stow__report_size_class(1024), 10);
    cr_assert_eq(stow__report_size_class(UINT64_MAX), 63);
    cr_assert_float_eq(stow__diff_pct(100, 103), 3.0, 1e-9);
    cr_assert_float_eq(stow__diff_pct(100, 90), -10.0, 1e-9);
    cr_assert_float_eq(stow__diff_pct(0, 0), 0.0, 1e-9);
    cr_assert_float_eq(stow__diff_pct(0, 5), 100.0, 1e-9);
}

static const char trace_a[] = "3 5\na 0 10485760 0\na 1 4096 0\nf 1\na 2 2048 0\nf 0\n";
/* B: the 10 MiB tensor grew to 20 MiB (both large: segments of their own size) */
static const char trace_b[] = "3 5\na 0 20971520 0\na 1 4096 0\nf 1\na 2 2048 0\nf 0\n";

Test(diff, side_figures_and_verdict)
{
    stow_trace_t *a = NULL, *b = NULL;
    char err[256];
    cr_assert_eq(stow_trace_parse("a", trace_a, strlen(trace_a), &a, err, sizeof err), STOW_OK);
    cr_assert_eq(stow_trace_parse("b", trace_b, strlen(trace_b), &b, err, sizeof err), STOW_OK);
    stow_config_t c;
    stow_config_default(&c);
    stow_diff_side_t sa, sb;
    const stow_replay_policy_t *p = stow__replay_policy_find("classic");
    cr_assert_eq(stow__diff_side(a, p, &c, true, &sa), STOW_OK);
    cr_assert_eq(stow__diff_side(b, p, &c, false, &sb), STOW_OK);
    cr_assert_eq(sa.peak_live_bytes, 10485760 + 4096);
    cr_assert(sa.has_min_capacity);
    cr_assert_eq(sa.class_at_peak[23], 10485760);
    cr_assert_eq(sa.class_at_peak[12], 4096);
    cr_assert_eq(sb.class_at_peak[24], 20971520);
    cr_assert_eq(sa.class_count[11], 1);
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    cr_assert(stow__diff_print(f, "a", "b", &sa, &sb, 2.0, "classic"));
    cr_assert_not(stow__diff_print(f, "a", "a", &sa, &sa, 2.0, "classic"));
    cr_assert_not(stow__diff_print(f, "b", "a", &sb, &sa, 2.0, "classic")); /* shrank */
    fclose(f);
    cr_assert_not_null(strstr(out, "[16 MiB, 32 MiB)"), "%s", out);
    cr_assert_not_null(strstr(out, "REGRESSION"));
    free(out);
    stow_trace_free(a);
    stow_trace_free(b);
}

static int cli(const char *args, char *out, size_t out_len)
{
    return ts_cli("diff", args, out, out_len);
}

static void write_file(char *path, const char *text)
{
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

Test(diff_cli, exit_codes)
{
    char a[] = "/tmp/stow_diff_a_XXXXXX", b[] = "/tmp/stow_diff_b_XXXXXX";
    char bad[] = "/tmp/stow_diff_bad_XXXXXX";
    write_file(a, trace_a);
    write_file(b, trace_b);
    write_file(bad, "1 1\nq 0\n");
    char args[512], out[16384];
    snprintf(args, sizeof args, "%s %s", a, a);
    cr_assert_eq(cli(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "%s %s", a, b);
    cr_assert_eq(cli(args, out, sizeof out), 1, "%s", out);
    snprintf(args, sizeof args, "%s %s --threshold 150", a, b);
    cr_assert_eq(cli(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "--policy naive %s %s", b, a); /* smaller: ok */
    cr_assert_eq(cli(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "%s %s", a, bad);
    cr_assert_eq(cli(args, out, sizeof out), 2, "%s", out);
    cr_assert_not_null(strstr(out, ":2: "), "%s", out); /* FILE:LINE from the trace parser */
    snprintf(args, sizeof args, "%s", a);
    cr_assert_eq(cli(args, out, sizeof out), 2);
    snprintf(args, sizeof args, "--threshold x %s %s", a, b);
    cr_assert_eq(cli(args, out, sizeof out), 2);
    snprintf(args, sizeof args, "--policy bogus %s %s", a, b);
    cr_assert_eq(cli(args, out, sizeof out), 2);
    unlink(a);
    unlink(b);
    unlink(bad);
}
