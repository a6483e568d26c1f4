/*
 * tests/unit/test_import.c: `stowage import rmm` (importers/rmm_import.c):
 * RMM logging_resource_adaptor CSV to .rep, dense ids and streams, failures
 * counted, and every malformed row reported as FILE:LINE: reason.
 */
#include <criterion/criterion.h>

#include "test_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "report/report.h"
#include "stowage/trace.h"

static stow_status_t import(const char *csv, char **rep, char *err, size_t err_len,
                            stow_rmm_import_stats_t *s)
{
    size_t len = 0;
    FILE *f = open_memstream(rep, &len);
    stow_status_t st = stow__rmm_import("log.csv", csv, strlen(csv), f, s, err, err_len);
    fclose(f);
    return st;
}

/* Imports csv, which must succeed with exactly want_rep and the statistics
 * want, and give a trace the parser accepts; returns its peak live bytes. */
static uint64_t expect_import(const char *csv, const char *want_rep,
                              const stow_rmm_import_stats_t *want)
{
    char *rep = NULL, err[256] = "";
    stow_rmm_import_stats_t s;
    cr_assert_eq(import(csv, &rep, err, sizeof err, &s), STOW_OK, "%s", err);
    cr_assert_str_eq(rep, want_rep);
    cr_assert_eq(s.allocations, want->allocations);
    cr_assert_eq(s.frees, want->frees);
    cr_assert_eq(s.failures, want->failures);
    cr_assert_eq(s.zero_size, want->zero_size);
    cr_assert_eq(s.streams, want->streams);
    cr_assert_eq(s.still_live, want->still_live);
    stow_trace_t *t = NULL;
    cr_assert_eq(stow_trace_parse("rep", rep, strlen(rep), &t, err, sizeof err), STOW_OK, "%s",
                 err);
    uint64_t peak = t->peak_live_bytes;
    stow_trace_free(t);
    free(rep);
    return peak;
}

Test(rmm_import, converts_with_dense_ids)
{
    const char csv[] = "Thread,Time,Action,Pointer,Size,Stream\n"
                       "1,10:00:00:000001,allocate,0x7f0000000000,1024,0x0\n"
                       "1,10:00:00:000002,allocate,0x7f0000100000,4096,0x55aa\r\n"
                       "1,10:00:00:000003,allocate failure,0x0,999999999999,0x0\n"
                       "1,10:00:00:000004,free,0x7f0000000000,1024,0x0\n"
                       "\n"
                       "1,10:00:00:000005,allocate,0x7f0000000000,512,0x0\n";
    stow_rmm_import_stats_t want = {.allocations = 3, .frees = 1, .failures = 1, .streams = 2,
                                    .still_live = 2};
    cr_assert_eq(expect_import(csv, "3 4\na 0 1024 0\na 1 4096 1\nf 0\na 2 512 0\n", &want),
                 5120);
}

/* RMM logs 0-byte allocations, with a null pointer when the resource returns
 * none: they hold no memory and the .rep format has none (the trace parser
 * refuses size 0), so they and their frees are left out and counted, never
 * written as "a 0 0 0", which no tool could read. */
Test(rmm_import, zero_byte_allocations_are_left_out_and_counted)
{
    const char csv[] = "Thread,Time,Action,Pointer,Size,Stream\n"
                       "1,t,allocate,0x0,0,0x0\n"
                       "1,t,allocate,0x7f0000000000,0,0x9\n"
                       "1,t,allocate,0x7f0000100000,4096,0x0\n"
                       "1,t,free,0x7f0000000000,0,0x9\n"
                       "1,t,free,0x0,0,0x0\n"
                       "1,t,allocate,0x7f0000000000,64,0x0\n"
                       "1,t,free,0x7f0000100000,4096,0x0\n";
    /* One stream: 0x9 held only a 0-byte allocation. */
    stow_rmm_import_stats_t want = {.allocations = 2, .frees = 1, .zero_size = 2, .streams = 1,
                                    .still_live = 1};
    cr_assert_eq(expect_import(csv, "2 3\na 0 4096 0\na 1 64 0\nf 0\n", &want), 4160);
}

static void expect_error(const char *csv, const char *want)
{
    char *rep = NULL, err[256] = "";
    cr_assert_eq(import(csv, &rep, err, sizeof err, NULL), STOW_EPARSE, "%s", csv);
    cr_assert_not_null(strstr(err, want), "got '%s', want '%s'", err, want);
    free(rep);
}

#define HDR "Thread,Time,Action,Pointer,Size,Stream\n"
#define A0 "1,t,allocate,0x10,64,0\n"

Test(rmm_import, errors_name_file_and_line)
{
    expect_error("", "log.csv:1: empty file");
    expect_error("Thread,Time,Action\n", "log.csv:1: expected the header");
    expect_error(HDR "1,t,allocate,0x10,64\n", "log.csv:2: expected 6 fields, got 5");
    expect_error(HDR A0 "1,t,allocate,zz,64,0\n", "log.csv:3: bad pointer 'zz'");
    expect_error(HDR "1,t,allocate,0x10,-5,0\n", "log.csv:2: bad size '-5'");
    /* Above 2^62 the trace it wrote would not parse (found by fuzz_rmm). */
    expect_error(HDR "1,t,allocate,0x10,4611686018427387905,0\n",
                 "log.csv:2: size 4611686018427387905 is absurd (more than 2^62)");
    expect_error(HDR "1,t,allocate,0x10,64,s1\n", "log.csv:2: bad stream 's1'");
    expect_error(HDR "1,t,reallocate,0x10,64,0\n", "log.csv:2: unknown action 'reallocate'");
    expect_error(HDR A0 A0, "log.csv:3: allocate of live pointer 0x10");
    expect_error(HDR A0 "\n1,t,free,0x20,64,0\n", "log.csv:4: free of unknown pointer 0x20");
    expect_error(HDR A0 "1,t,free,0x10,32,0\n", "log.csv:3: free of 0x10 with size 32");
    expect_error(HDR A0 "1,t,free,0x10,64,0\n1,t,free,0x10,64,0\n",
                 "log.csv:4: free of unknown pointer");
    /* 0-byte allocations are matched like the others. */
    expect_error(HDR "1,t,allocate,0x10,0,0\n1,t,free,0x10,64,0\n",
                 "log.csv:3: free of 0x10 with size 64, allocated with 0");
    expect_error(HDR A0 "1,t,free,0x10,0,0\n", "log.csv:3: free of 0x10 with size 0");
    expect_error(HDR "1,t,allocate,0x10,0,0\n1,t,allocate,0x10,0,0\n",
                 "log.csv:3: allocate of live pointer 0x10 (a 0-byte allocation)");
    expect_error(HDR "1,t,allocate,0x0,64,0\n", "log.csv:2: allocate of pointer 0x0");
    expect_error(HDR "1,t,free,0x0,64,0\n", "log.csv:2: free of unknown pointer 0x0");
}

static int cli(const char *args, char *out, size_t out_len)
{
    return ts_cli("import", args, out, out_len);
}

/* Each way a number can be wrong has its own reason. */
Test(rmm_import, number_errors_say_why)
{
    expect_error(HDR "1,t,allocate,0x10,-5,0\n", "log.csv:2: bad size '-5': negative");
    expect_error(HDR "1,t,allocate,0x10,99999999999999999999999,0\n",
                 "log.csv:2: bad size '99999999999999999999999': beyond 2^64 - 1");
    expect_error(HDR "1,t,allocate,0x10,64k,0\n",
                 "log.csv:2: bad size '64k': not a decimal number");
    expect_error(HDR "1,t,allocate,0x10,,0\n", "log.csv:2: bad size '': empty");
    expect_error(HDR "1,t,allocate,0x10,64,-1\n", "log.csv:2: bad stream '-1': negative");
    expect_error(HDR "1,t,allocate,-0x10,64,0\n", "log.csv:2: bad pointer '-0x10': negative");
    expect_error(HDR "1,t,allocate,0x10000000000000000,64,0\n",
                 "log.csv:2: bad pointer '0x10000000000000000': beyond 2^64 - 1");
}

Test(rmm_import_cli, file_line_and_exit_status)
{
    char in[] = "/tmp/stow_rmm_XXXXXX", out_path[] = "/tmp/stow_rmm_out_XXXXXX";
    int fd = mkstemp(in);
    const char bad[] = HDR A0 "1,t,free,0x99,64,0\n";
    cr_assert_eq(write(fd, bad, sizeof bad - 1), (ssize_t)(sizeof bad - 1));
    close(fd);
    close(mkstemp(out_path));
    char args[512], out[4096], want[128];
    snprintf(args, sizeof args, "rmm %s -o %s", in, out_path);
    cr_assert_eq(cli(args, out, sizeof out), 2, "%s", out);
    snprintf(want, sizeof want, "%s:3: free of unknown pointer 0x99", in);
    cr_assert_not_null(strstr(out, want), "%s", out);
    cr_assert_neq(access(out_path, F_OK), 0); /* no half-written trace left */
    fd = open(in, O_WRONLY | O_TRUNC);
    const char good[] = HDR A0 "1,t,free,0x10,64,0\n";
    cr_assert_eq(write(fd, good, sizeof good - 1), (ssize_t)(sizeof good - 1));
    close(fd);
    cr_assert_eq(cli(args, out, sizeof out), 0, "%s", out);
    FILE *f = fopen(out_path, "r");
    char rep[64] = "";
    cr_assert_gt(fread(rep, 1, sizeof rep - 1, f), 0);
    fclose(f);
    cr_assert_str_eq(rep, "1 2\na 0 64 0\nf 0\n");
    cr_assert_eq(cli("csv x -o y", out, sizeof out), 2);
    cr_assert_eq(cli("rmm /nonexistent.csv -o /tmp/x.rep", out, sizeof out), 2);
    unlink(in);
    unlink(out_path);
}
