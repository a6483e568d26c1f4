/*
 * tests/unit/test_trace.c: trace/trace.c (stowage/trace.h).
 *
 * Valid traces (comments, blank lines, CRLF, tabs, no final newline) give the
 * right events, stream count and live-bytes peak, also on random traces checked
 * against a shadow. Every rejection is STOW_EPARSE with the exact
 * "NAME:LINE: reason" message and *out untouched. stow_trace_load reads files
 * (STOW_EIO when missing), gzip-compressed ones as their text (a truncated or
 * corrupt stream named with its file and line), and the shared real traces
 * match their README.
 */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stowage/trace.h"
#include "test_support.h"

static stow_trace_t *const UNTOUCHED = (stow_trace_t *)(uintptr_t)0x5151;

static stow_trace_t *parse_ok(const char *text)
{
    stow_trace_t *t = NULL;
    char err[256] = "junk";
    stow_status_t st = stow_trace_parse("t", text, strlen(text), &t, err, sizeof err);
    cr_assert_eq(st, STOW_OK, "status %d: %s\n--- text ---\n%s", (int)st, err, text);
    cr_assert_str_empty(err);
    cr_assert_not_null(t);
    return t;
}

static void parse_err(const char *text, const char *want)
{
    stow_trace_t *t = UNTOUCHED;
    char err[256] = "junk";
    stow_status_t st = stow_trace_parse("t", text, strlen(text), &t, err, sizeof err);
    cr_assert_eq(st, STOW_EPARSE, "status %d for\n%s", (int)st, text);
    cr_assert_eq(t, UNTOUCHED, "*out changed on error");
    cr_assert_str_eq(err, want, "for text:\n%s", text);
}

static void check_event(const stow_trace_t *t, size_t i, char kind, uint32_t id, uint64_t size,
                        uint16_t stream)
{
    cr_assert_lt(i, t->event_count);
    const stow_trace_event_t *e = &t->events[i];
    cr_assert_eq(e->kind, (uint8_t)kind, "event %zu kind", i);
    cr_assert_eq(e->id, id, "event %zu id", i);
    cr_assert_eq(e->size_bytes, size, "event %zu size", i);
    cr_assert_eq(e->stream, stream, "event %zu stream", i);
    cr_assert_eq(e->reserved_, 0);
}

/* ---- valid traces ---- */

Test(trace, minimal)
{
    stow_trace_t *t = parse_ok("2 3\na 0 100 0\na 1 50 0\nf 0\n");
    cr_assert_str_eq(t->path, "t");
    cr_assert_eq(t->id_count, 2);
    cr_assert_eq(t->event_count, 3);
    cr_assert_eq(t->stream_count, 1);
    check_event(t, 0, 'a', 0, 100, 0);
    check_event(t, 1, 'a', 1, 50, 0);
    check_event(t, 2, 'f', 0, 100, 0);
    cr_assert_eq(t->peak_live_bytes, 150);
    cr_assert_eq(t->peak_live_event, 1);
    stow_trace_free(t);
}

Test(trace, empty_trace_with_header_only)
{
    stow_trace_t *t = parse_ok("0 0\n");
    cr_assert_eq(t->event_count, 0);
    cr_assert_eq(t->id_count, 0);
    cr_assert_eq(t->peak_live_bytes, 0);
    cr_assert_eq(t->stream_count, 1);
    stow_trace_free(t);
    t = parse_ok("5 0");
    cr_assert_eq(t->id_count, 5);
    stow_trace_free(t);
}

Test(trace, comments_blank_lines_crlf_tabs)
{
    stow_trace_t *t = parse_ok("# recorded by hand\r\n"
                               "\r\n"
                               "   \t\n"
                               "  3\t4  \r\n"
                               "# allocations\n"
                               "a 0 1000 0\r\n"
                               "\t a\t1  2000\t1 \r\n"
                               "\n"
                               "  # comment with leading blanks\n"
                               "f 1\r\n"
                               "a 2 512 3\r\n");
    cr_assert_eq(t->id_count, 3);
    cr_assert_eq(t->event_count, 4);
    cr_assert_eq(t->stream_count, 4);
    check_event(t, 0, 'a', 0, 1000, 0);
    check_event(t, 1, 'a', 1, 2000, 1);
    check_event(t, 2, 'f', 1, 2000, 1);
    check_event(t, 3, 'a', 2, 512, 3);
    cr_assert_eq(t->peak_live_bytes, 3000);
    cr_assert_eq(t->peak_live_event, 1);
    stow_trace_free(t);
}

Test(trace, no_final_newline)
{
    stow_trace_t *t = parse_ok("1 2\na 0 7 0\nf 0");
    cr_assert_eq(t->event_count, 2);
    check_event(t, 1, 'f', 0, 7, 0);
    stow_trace_free(t);
}

Test(trace, peak_is_first_reached)
{
    /* 100, 300, 200, 300 (again), 0: the peak event is the first 300. */
    stow_trace_t *t = parse_ok("4 6\na 0 100 0\na 1 200 0\nf 0\na 2 100 0\nf 1\nf 2\n");
    cr_assert_eq(t->peak_live_bytes, 300);
    cr_assert_eq(t->peak_live_event, 1);
    stow_trace_free(t);
    t = parse_ok("3 4\na 0 10 0\nf 0\na 1 5 0\na 2 6 0\n");
    cr_assert_eq(t->peak_live_bytes, 11);
    cr_assert_eq(t->peak_live_event, 3);
    stow_trace_free(t);
}

Test(trace, limits_accepted)
{
    /* size 2^62 and stream 65535 are the largest values accepted. */
    stow_trace_t *t = parse_ok("2 2\na 0 4611686018427387904 65535\na 1 4611686018427387904 2\n");
    cr_assert_eq(t->stream_count, 65536);
    cr_assert_eq(t->peak_live_bytes, (uint64_t)1 << 63);
    check_event(t, 0, 'a', 0, (uint64_t)1 << 62, 65535);
    stow_trace_free(t);
}

Test(trace, free_carries_alloc_stream_and_size)
{
    stow_trace_t *t = parse_ok("2 4\na 0 4096 7\na 1 512 2\nf 0\nf 1\n");
    check_event(t, 2, 'f', 0, 4096, 7);
    check_event(t, 3, 'f', 1, 512, 2);
    cr_assert_eq(t->stream_count, 8);
    stow_trace_free(t);
}

/* ---- step markers ---- */

Test(trace, markers_are_not_events)
{
    stow_trace_t *t = parse_ok("# a loop\n"
                               "2 4\n"
                               "m train\n"
                               "a 0 100 0\n"
                               "  m\teval/len:128  \r\n"
                               "f 0\n"
                               "m train\n"
                               "a 1 50 1\n"
                               "e\n"
                               "f 1\n"
                               "m Z_.:/-9\n");
    cr_assert_eq(t->event_count, 4);
    check_event(t, 1, 'f', 0, 100, 0);
    check_event(t, 2, 'a', 1, 50, 1);
    cr_assert_eq(t->marker_count, 5);
    cr_assert_eq(t->key_count, 3);
    cr_assert_str_eq(t->keys[0], "train");
    cr_assert_str_eq(t->keys[1], "eval/len:128");
    cr_assert_str_eq(t->keys[2], "Z_.:/-9");
    size_t before[] = {0, 1, 2, 3, 4};
    uint32_t key[] = {0, 1, 0, STOW_TRACE_STEP_END, 2};
    for (size_t i = 0; i < 5; i++) {
        cr_assert_eq(t->markers[i].before_event, before[i], "marker %zu", i);
        cr_assert_eq(t->markers[i].key, key[i], "marker %zu", i);
    }
    stow_trace_free(t);
    t = parse_ok("1 1\na 0 5 0\n");
    cr_assert_eq(t->marker_count, 0);
    cr_assert_null(t->markers);
    cr_assert_eq(t->key_count, 0);
    stow_trace_free(t);
}

Test(trace, many_distinct_keys_are_interned)
{
    enum { KEYS = 3000 };
    char *text = malloc(KEYS * 2 * 16 + 64);
    cr_assert_not_null(text);
    size_t len = (size_t)sprintf(text, "0 0\n");
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < KEYS; k++)
            len += (size_t)sprintf(text + len, "m k%d\n", k);
    stow_trace_t *t = parse_ok(text);
    cr_assert_eq(t->key_count, KEYS);
    cr_assert_eq(t->marker_count, 2 * KEYS);
    for (size_t i = 0; i < 2 * KEYS; i++)
        cr_assert_eq(t->markers[i].key, i % KEYS);
    cr_assert_str_eq(t->keys[KEYS - 1], "k2999");
    stow_trace_free(t);
    free(text);
}

Test(trace, malformed_markers_name_the_line)
{
    parse_err("1 1\nm\na 0 5 0\n", "t:2: a step marker must be 'm <key>'");
    parse_err("1 1\na 0 5 0\nm   \n", "t:3: a step marker must be 'm <key>'");
    parse_err("1 1\nmtrain\n", "t:2: a step marker must be 'm <key>'");
    parse_err("1 1\nm a b\n", "t:2: a step marker has one key and nothing after it");
    parse_err("1 1\nm tr@in\n",
              "t:2: step key 'tr@in': only letters, digits and _.:/- are allowed");
    parse_err("0 0\nm 0123456789012345678901234567890123456789012345678901234567890123x\n",
              "t:2: step key of 65 characters (at most 64)");
    parse_err("1 1\ne train\n", "t:2: a step end must be 'e' alone");
    parse_err("1 1\nex\n", "t:2: a step end must be 'e' alone");
    /* A key of exactly 64 characters is fine. */
    stow_trace_t *t =
        parse_ok("0 0\nm 0123456789012345678901234567890123456789012345678901234567890123\n");
    cr_assert_eq(strlen(t->keys[0]), 64);
    stow_trace_free(t);
}

/* ---- random traces against a shadow ---- */

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

Test(trace, random_traces_match_shadow)
{
    enum { IDS = 400 };
    rng_state = 77;
    size_t cap = (size_t)IDS * 2 * 64 + 64;
    char *text = malloc(cap);
    uint64_t *size = malloc(IDS * sizeof *size);
    uint16_t *stream = malloc(IDS * sizeof *stream);
    uint8_t *state = malloc(IDS);
    stow_trace_event_t *want = malloc(2 * IDS * sizeof *want);
    cr_assert(text && size && stream && state && want);
    for (unsigned round = 0; round < 30; round++) {
        memset(state, 0, IDS);
        uint32_t next_id = 0, max_stream = 0;
        size_t n = 0, len = 0;
        uint64_t live = 0, peak = 0;
        size_t peak_event = 0;
        char body[96];
        /* Header written last into a fixed-width slot. */
        len = (size_t)snprintf(text, cap, "%-30s\n", "");
        while (next_id < IDS || rng_next() % 4) {
            uint32_t live_ids[IDS];
            uint32_t nl = 0;
            for (uint32_t i = 0; i < next_id; i++)
                if (state[i] == 1)
                    live_ids[nl++] = i;
            if (next_id < IDS && (nl == 0 || rng_next() % 3 != 0)) {
                uint32_t id = next_id++;
                size[id] = 1 + rng_next() % ((rng_next() % 2) ? 4096 : ((uint64_t)1 << 40));
                stream[id] = (uint16_t)(rng_next() % 5 == 0 ? rng_next() % 9 : 0);
                state[id] = 1;
                live += size[id];
                if (stream[id] > max_stream)
                    max_stream = stream[id];
                want[n] = (stow_trace_event_t){size[id], id, stream[id], 'a', 0};
                snprintf(body, sizeof body, "a %u %llu %u\n", id, (unsigned long long)size[id],
                         stream[id]);
            } else if (nl) {
                uint32_t id = live_ids[rng_next() % nl];
                state[id] = 2;
                live -= size[id];
                want[n] = (stow_trace_event_t){size[id], id, stream[id], 'f', 0};
                snprintf(body, sizeof body, "f %u\n", id);
            } else {
                break;
            }
            if (live > peak) {
                peak = live;
                peak_event = n;
            }
            n++;
            if (rng_next() % 16 == 0)
                len += (size_t)snprintf(text + len, cap - len, "# note\n\n");
            len += (size_t)snprintf(text + len, cap - len, "%s", body);
        }
        char header[32];
        snprintf(header, sizeof header, "%u %zu", IDS, n);
        memcpy(text, header, strlen(header));
        stow_trace_t *t = NULL;
        char err[256];
        cr_assert_eq(stow_trace_parse("r", text, len, &t, err, sizeof err), STOW_OK, "%s", err);
        cr_assert_eq(t->event_count, n);
        cr_assert_eq(t->stream_count, max_stream + 1);
        cr_assert_eq(t->peak_live_bytes, peak);
        cr_assert_eq(t->peak_live_event, peak_event);
        for (size_t i = 0; i < n; i++)
            check_event(t, i, (char)want[i].kind, want[i].id, want[i].size_bytes, want[i].stream);
        stow_trace_free(t);
    }
    free(text);
    free(size);
    free(stream);
    free(state);
    free(want);
}

/* ---- header errors ---- */

#define HEADER_FORM "(header must be '<number of ids> <number of events>')"
#define SIZE_RANGE "(sizes are 1 to 2^62 bytes)"
#define STREAM_RANGE "(streams are 0 to 65535)"

Test(trace, header_errors)
{
    parse_err("", "t: the file is empty; a trace starts with the header '<number of ids> "
                  "<number of events>'");
    parse_err("# only a comment\n\n", "t:2: empty trace: missing header '<ids> <events>'");
    parse_err("2\n", "t:1: the header ends before its <number of events> (header must be "
                     "'<number of ids> <number of events>')");
    parse_err("\n# c\n2 3 4\n", "t:3: header must be '<number of ids> <number of events>'");
    parse_err("a 0 1 0\n", "t:1: number of ids 'a' is not a decimal number " HEADER_FORM);
    parse_err("-1 2\n", "t:1: number of ids '-1' is negative " HEADER_FORM);
    parse_err("2 -2\n", "t:1: number of events '-2' is negative " HEADER_FORM);
    parse_err("+2 2\n", "t:1: number of ids '+2' is not a decimal number " HEADER_FORM);
    parse_err("2x 2\n", "t:1: number of ids '2x' is not a decimal number " HEADER_FORM);
    parse_err("99999999999999999999999 1\n",
              "t:1: number of ids '99999999999999999999999' is beyond 2^64 - 1 " HEADER_FORM);
    parse_err("1 99999999999999999999999\n",
              "t:1: number of events '99999999999999999999999' is beyond 2^64 - 1 " HEADER_FORM);
    parse_err("18446744073709551616 0\n",
              "t:1: number of ids '18446744073709551616' is beyond 2^64 - 1 " HEADER_FORM);
    parse_err("4294967296 0\n", "t:1: too many ids (4294967296, at most 4294967295)");
    parse_err("18446744073709551615 0\n",
              "t:1: too many ids (18446744073709551615, at most 4294967295)");
    parse_err("1 3\n", "t:1: header announces 3 events for 1 ids (at most 2 per id)");
    parse_err("0 1\n", "t:1: header announces 1 events for 0 ids (at most 2 per id)");
    parse_err("4294967295 18446744073709551615\n",
              "t:1: header announces 18446744073709551615 events for 4294967295 ids (at most 2 "
              "per id)");
}

/* ---- event errors ---- */

Test(trace, malformed_event_lines)
{
    const char *expect_kind = "t:3: expected 'a <id> <size> <stream>' or 'f <id>'";
    parse_err("2 2\na 0 1 0\nx 1\n", expect_kind);
    parse_err("2 2\na 0 1 0\na\n",
              "t:3: the line ends before its <id>: expected 'a <id> <size> <stream>'");
    parse_err("2 2\na 0 1 0\nf\n", "t:3: the line ends before its <id>: expected 'f <id>'");
    parse_err("2 2\na 0 1 0\na1 1 0\n", expect_kind);
    parse_err("2 2\na 0 1 0\nA 1 1 0\n", expect_kind);
    parse_err("2 2\na 0 1 0\nalloc 1 1 0\n", expect_kind);
    parse_err("2 2\na 0 1 0\na x 1 0\n", "t:3: id 'x' is not a decimal number");
    parse_err("2 2\na 0 1 0\nf -1\n", "t:3: id '-1' is negative");
    parse_err("2 2\na 0 1 0\nf 99999999999999999999999\n",
              "t:3: id '99999999999999999999999' is beyond 2^64 - 1");
    const char *alloc_form = "t:3: allocation must be 'a <id> <size> <stream>'";
    const char *no_size = "t:3: allocation 1: the line ends before its <size>: expected "
                          "'a <id> <size> <stream>'";
    const char *no_stream = "t:3: allocation 1: the line ends before its <stream>: expected "
                            "'a <id> <size> <stream>'";
    parse_err("2 2\na 0 1 0\na 1\n", no_size);
    parse_err("2 2\na 0 1 0\na 1 100\n", no_stream);
    parse_err("2 2\na 0 1 0\na 1 100 \r\n", no_stream);
    parse_err("2 2\na 0 1 0\na 1 100 0 0\n", alloc_form);
    parse_err("2 2\na 0 1 0\na 1 -100 0\n",
              "t:3: allocation 1: size '-100' is negative " SIZE_RANGE);
    parse_err("2 2\na 0 1 0\na 1 100 -1\n",
              "t:3: allocation 1: stream '-1' is negative " STREAM_RANGE);
    parse_err("2 2\na 0 1 0\na 1 1e3 0\n",
              "t:3: allocation 1: size '1e3' is not a decimal number " SIZE_RANGE);
    parse_err("2 2\na 0 1 0\na 1 100 0 # trailing comment\n", alloc_form);
    parse_err("2 2\na 0 1 0\na 1 99999999999999999999999 0\n",
              "t:3: allocation 1: size '99999999999999999999999' is beyond 2^64 - 1 " SIZE_RANGE);
    parse_err("2 2\na 0 1 0\na 1 100 99999999999999999999999\n",
              "t:3: allocation 1: stream '99999999999999999999999' is beyond 2^64 - 1 "
              STREAM_RANGE);
    parse_err("2 2\na 0 1 0\nf 0 100\n", "t:3: free must be 'f <id>'");
}

Test(trace, bad_values)
{
    parse_err("2 2\na 0 1 0\na 1 0 0\n", "t:3: allocation 1 has size 0");
    parse_err("2 2\na 0 1 0\na 1 4611686018427387905 0\n",
              "t:3: allocation 1: size 4611686018427387905 is absurd (more than 2^62)");
    parse_err("1 1\na 0 18446744073709551615 0\n",
              "t:2: allocation 0: size 18446744073709551615 is absurd (more than 2^62)");
    parse_err("1 1\na 0 100 65536\n", "t:2: stream index 65536 too large");
    parse_err("1 1\na 0 100 4294967297\n", "t:2: stream index 4294967297 too large");
}

Test(trace, ids_out_of_range)
{
    parse_err("2 1\na 2 100 0\n", "t:2: id 2 out of range (header says 2 ids)");
    parse_err("2 2\na 0 100 0\nf 5\n", "t:3: id 5 out of range (header says 2 ids)");
    parse_err("2 1\na 18446744073709551615 100 0\n",
              "t:2: id 18446744073709551615 out of range (header says 2 ids)");
    parse_err("0 0\n\na 0 1 0\n", "t:3: more events than the header's 0");
}

Test(trace, lifecycle_errors)
{
    parse_err("2 2\na 0 100 0\na 0 200 0\n", "t:3: id 0 allocated twice");
    parse_err("2 3\na 0 100 0\nf 0\na 0 100 0\n", "t:4: id 0 allocated twice");
    parse_err("2 3\na 0 100 0\nf 0\nf 0\n", "t:4: id 0 freed twice");
    parse_err("1 1\nf 0\n", "t:2: id 0 freed before it was allocated");
    parse_err("3 2\na 0 100 0\n# c\nf 1\n", "t:4: id 1 freed before it was allocated");
}

Test(trace, event_count_mismatch)
{
    /* Fewer events than announced: reported at the last line of the file. */
    parse_err("2 3\na 0 1 0\nf 0\n", "t:3: header announces 3 events, file has 2");
    parse_err("2 3\na 0 1 0\nf 0", "t:3: header announces 3 events, file has 2");
    parse_err("2 3\na 0 1 0\nf 0\n\n# end\n", "t:5: header announces 3 events, file has 2");
    parse_err("2 1\n", "t:1: header announces 1 events, file has 0");
    /* More: reported at the first extra event line. */
    parse_err("1 1\na 0 1 0\nf 0\n", "t:3: more events than the header's 1");
    parse_err("2 2\na 0 1 0\n\n# c\na 1 1 0\nf 0\n", "t:6: more events than the header's 2");
}

Test(trace, err_buffer_handling)
{
    const char *bad = "1 1\nf 0\n";
    stow_trace_t *t = UNTOUCHED;
    char err[8];
    memset(err, 'x', sizeof err);
    cr_assert_eq(stow_trace_parse("name", bad, strlen(bad), &t, err, sizeof err), STOW_EPARSE);
    cr_assert_str_eq(err, "name:2:");
    char one[1] = {'x'};
    cr_assert_eq(stow_trace_parse("name", bad, strlen(bad), &t, one, 1), STOW_EPARSE);
    cr_assert_eq(one[0], '\0');
    cr_assert_eq(stow_trace_parse("name", bad, strlen(bad), &t, NULL, 0), STOW_EPARSE);
    /* A long name that fills err entirely. */
    char name[300];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    char err2[64];
    cr_assert_eq(stow_trace_parse(name, bad, strlen(bad), &t, err2, sizeof err2), STOW_EPARSE);
    cr_assert_eq(strlen(err2), sizeof err2 - 1);
    cr_assert_eq(t, UNTOUCHED);
}

Test(trace, invalid_arguments)
{
    stow_trace_t *t = UNTOUCHED;
    char err[32];
    cr_assert_eq(stow_trace_parse(NULL, "0 0\n", 4, &t, err, sizeof err), STOW_EINVAL);
    cr_assert_eq(stow_trace_parse("t", NULL, 4, &t, err, sizeof err), STOW_EINVAL);
    cr_assert_eq(stow_trace_parse("t", "0 0\n", 4, NULL, err, sizeof err), STOW_EINVAL);
    cr_assert_eq(stow_trace_load(NULL, &t, err, sizeof err), STOW_EINVAL);
    cr_assert_eq(t, UNTOUCHED);
    /* NULL text with length 0 is an empty trace. */
    cr_assert_eq(stow_trace_parse("t", NULL, 0, &t, err, sizeof err), STOW_EPARSE);
    stow_trace_free(NULL);
}

Test(trace, parse_respects_text_len)
{
    /* Only text_len bytes are read: the rest of the buffer is not part of it. */
    const char *text = "1 1\na 0 5 0\nf 0\n";
    stow_trace_t *t = NULL;
    char err[128];
    cr_assert_eq(stow_trace_parse("t", text, 12, &t, err, sizeof err), STOW_OK, "%s", err);
    cr_assert_eq(t->event_count, 1);
    stow_trace_free(t);
}

/* ---- files ---- */

Test(trace, load_missing_file)
{
    stow_trace_t *t = UNTOUCHED;
    char err[256];
    cr_assert_eq(stow_trace_load("/nonexistent/dir/x.rep", &t, err, sizeof err), STOW_EIO);
    cr_assert_eq(t, UNTOUCHED);
    cr_assert(strncmp(err, "/nonexistent/dir/x.rep: ", 24) == 0, "err '%s'", err);
}

static void write_temp(char *path, const char *text)
{
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    size_t n = strlen(text);
    cr_assert_eq(write(fd, text, n), (ssize_t)n);
    close(fd);
}

Test(trace, load_file_and_name_in_errors)
{
    char path[] = "/tmp/stow_trace_XXXXXX";
    write_temp(path, "# file\n2 4\na 0 10 0\na 1 20 1\nf 1\nf 0\n");
    stow_trace_t *t = NULL;
    char err[512];
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_OK, "%s", err);
    cr_assert_str_eq(t->path, path);
    cr_assert_eq(t->event_count, 4);
    cr_assert_eq(t->peak_live_bytes, 30);
    cr_assert_eq(t->stream_count, 2);
    stow_trace_free(t);
    unlink(path);

    char bad[] = "/tmp/stow_trace_XXXXXX";
    write_temp(bad, "2 2\na 0 10 0\nf 1\n");
    t = UNTOUCHED;
    cr_assert_eq(stow_trace_load(bad, &t, err, sizeof err), STOW_EPARSE);
    char want[600];
    snprintf(want, sizeof want, "%s:3: id 1 freed before it was allocated", bad);
    cr_assert_str_eq(err, want);
    cr_assert_eq(t, UNTOUCHED);
    unlink(bad);
}

/* Each way a number can be wrong has its own reason, for every field. */
Test(trace, field_errors_name_the_field_and_the_reason)
{
    struct {
        const char *text, *want;
    } cases[] = {
        {"1 1\na 0 -5 0\n", "t:2: allocation 0: size '-5' is negative " SIZE_RANGE},
        {"1 1\na 0 18446744073709551616 0\n",
         "t:2: allocation 0: size '18446744073709551616' is beyond 2^64 - 1 " SIZE_RANGE},
        {"1 1\na 0 12x 0\n", "t:2: allocation 0: size '12x' is not a decimal number " SIZE_RANGE},
        {"1 1\na 0 - 0\n", "t:2: allocation 0: size '-' is not a decimal number " SIZE_RANGE},
        {"1 1\na 0\n",
         "t:2: allocation 0: the line ends before its <size>: expected 'a <id> <size> <stream>'"},
        {"1 1\na 0 5\n",
         "t:2: allocation 0: the line ends before its <stream>: expected 'a <id> <size> "
         "<stream>'"},
        {"1 1\na 0 5 -0\n", "t:2: allocation 0: stream '-0' is negative " STREAM_RANGE},
        {"1 1\na 0 5 s1\n", "t:2: allocation 0: stream 's1' is not a decimal number " STREAM_RANGE},
        {"1 1\na -3 5 0\n", "t:2: id '-3' is negative"},
        {"1 1\na\t\n", "t:2: the line ends before its <id>: expected 'a <id> <size> <stream>'"},
        {"1 2\na 0 5 0\nf 0x0\n", "t:3: id '0x0' is not a decimal number"},
        {"1\n", "t:1: the header ends before its <number of events> " HEADER_FORM},
        {"x 1\n", "t:1: number of ids 'x' is not a decimal number " HEADER_FORM},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        parse_err(cases[i].text, cases[i].want);
}

Test(trace, empty_file_is_a_sentence_naming_it)
{
    char path[] = "/tmp/stow_trace_XXXXXX";
    write_temp(path, "");
    stow_trace_t *t = UNTOUCHED;
    char err[512], want[600];
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_EPARSE);
    snprintf(want, sizeof want,
             "%s: the file is empty; a trace starts with the header '<number of ids> <number of "
             "events>'",
             path);
    cr_assert_str_eq(err, want);
    cr_assert_eq(t, UNTOUCHED);
    unlink(path);
}

Test(trace, directory_is_not_a_trace_file)
{
    char dir[] = "/tmp/stow_trace_dir_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    stow_trace_t *t = UNTOUCHED;
    char err[512], want[600];
    cr_assert_eq(stow_trace_load(dir, &t, err, sizeof err), STOW_EIO);
    snprintf(want, sizeof want, "%s: is a directory, not a trace file", dir);
    cr_assert_str_eq(err, want);
    cr_assert_eq(t, UNTOUCHED);
    rmdir(dir);
}

Test(trace, load_large_file_crosses_read_chunks)
{
    /* > 1 MiB so that the reader grows its buffer. */
    enum { IDS = 60000 };
    char path[] = "/tmp/stow_trace_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    fprintf(f, "%d %d\n", IDS, 2 * IDS);
    for (int i = 0; i < IDS; i++)
        fprintf(f, "a %d %d 0\nf %d\n", i, 1000000 + i, i);
    fclose(f);
    stow_trace_t *t = NULL;
    char err[256];
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_OK, "%s", err);
    cr_assert_eq(t->event_count, 2 * IDS);
    cr_assert_eq(t->peak_live_bytes, 1000000 + IDS - 1);
    cr_assert_eq(t->peak_live_event, 2 * (IDS - 1));
    stow_trace_free(t);
    unlink(path);
}

/* ---- gzip-compressed traces (trace/gz.c) ---- */

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert_geq(n, 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_bytes(char *path, const void *data, size_t len)
{
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, data, len), (ssize_t)len);
    close(fd);
}

#ifdef STOW_HAVE_ZLIB
#include <zlib.h>

/* text as `members` gzip members, one after another (as `cat a.gz b.gz`
 * makes); *len is the compressed size. */
static unsigned char *gzip_bytes(const char *text, size_t text_len, int members, size_t *len)
{
    size_t cap = text_len + 1024 * (size_t)members, used = 0;
    unsigned char *out = malloc(cap);
    cr_assert_not_null(out);
    for (int m = 0; m < members; m++) {
        size_t from = text_len * (size_t)m / (size_t)members;
        size_t to = text_len * (size_t)(m + 1) / (size_t)members;
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        cr_assert_eq(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY),
                     Z_OK);
        zs.next_in = (Bytef *)(text + from);
        zs.avail_in = (uInt)(to - from);
        zs.next_out = out + used;
        zs.avail_out = (uInt)(cap - used);
        cr_assert_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
        used = cap - zs.avail_out;
        deflateEnd(&zs);
    }
    *len = used;
    return out;
}

static void assert_same_trace(const stow_trace_t *a, const stow_trace_t *b)
{
    cr_assert_eq(a->id_count, b->id_count);
    cr_assert_eq(a->stream_count, b->stream_count);
    cr_assert_eq(a->event_count, b->event_count);
    cr_assert_eq(memcmp(a->events, b->events, a->event_count * sizeof *a->events), 0);
    cr_assert_eq(a->peak_live_bytes, b->peak_live_bytes);
    cr_assert_eq(a->peak_live_event, b->peak_live_event);
    cr_assert_eq(a->marker_count, b->marker_count);
    if (a->marker_count)
        cr_assert_eq(memcmp(a->markers, b->markers, a->marker_count * sizeof *a->markers), 0);
    cr_assert_eq(a->key_count, b->key_count);
    for (uint32_t k = 0; k < a->key_count; k++)
        cr_assert_str_eq(a->keys[k], b->keys[k]);
}

/* A compressed trace reads as the plain one, found by its magic bytes under a
 * name without .gz, in one member or several. */
Test(trace, gzip_trace_equals_the_plain_one)
{
    const char *plain_path = STOW_SOURCE_DIR "/bench/traces/resnet50_train.rep";
    size_t text_len;
    char *text = read_all(plain_path, &text_len);
    /* Markers and keys too: the bundled trace with a step marker line in front. */
    const char *head = "m train\n";
    char *marked = malloc(text_len + strlen(head) + 1);
    cr_assert_not_null(marked);
    const char *nl = memchr(text, '\n', text_len);
    cr_assert_not_null(nl);
    size_t header = (size_t)(nl - text) + 1;
    memcpy(marked, text, header);
    memcpy(marked + header, head, strlen(head));
    memcpy(marked + header + strlen(head), nl + 1, text_len - header);
    size_t marked_len = text_len + strlen(head);
    char err[512];
    stow_trace_t *plain = NULL;
    cr_assert_eq(stow_trace_parse("plain", marked, marked_len, &plain, err, sizeof err), STOW_OK,
                 "%s", err);
    cr_assert_eq(plain->marker_count, 1);
    for (int members = 1; members <= 3; members += 2) {
        size_t gz_len;
        unsigned char *gz = gzip_bytes(marked, marked_len, members, &gz_len);
        cr_assert_lt(gz_len, marked_len / 2, "compressed %zu of %zu", gz_len, marked_len);
        char path[] = "/tmp/stow_trace_gz_XXXXXX";
        write_bytes(path, gz, gz_len);
        stow_trace_t *t = NULL;
        cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_OK, "%s", err);
        cr_assert_str_eq(t->path, path);
        assert_same_trace(t, plain);
        stow_trace_free(t);
        t = NULL;
        cr_assert_eq(stow_trace_parse("mem", (const char *)gz, gz_len, &t, err, sizeof err),
                     STOW_OK, "%s", err);
        assert_same_trace(t, plain);
        stow_trace_free(t);
        unlink(path);
        free(gz);
    }
    stow_trace_free(plain);
    free(marked);
    free(text);
}

/* The lines of a compressed trace are those of its text. */
Test(trace, gzip_trace_errors_name_the_file_and_line)
{
    const char *bad = "# header next\n2 2\na 0 10 0\nf 1\n";
    size_t gz_len;
    unsigned char *gz = gzip_bytes(bad, strlen(bad), 1, &gz_len);
    char path[] = "/tmp/stow_trace_gz_XXXXXX";
    write_bytes(path, gz, gz_len);
    stow_trace_t *t = UNTOUCHED;
    char err[512], want[600];
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_EPARSE);
    snprintf(want, sizeof want, "%s:4: id 1 freed before it was allocated", path);
    cr_assert_str_eq(err, want);
    cr_assert_eq(t, UNTOUCHED);
    unlink(path);
    free(gz);
}

/* A truncated stream names the file, the line it broke off in and how much
 * came; a corrupt one the compressed byte and zlib's reason; bytes after the
 * end that are not another member are corrupt too. *out stays untouched. */
Test(trace, truncated_and_corrupt_gzip_name_the_file)
{
    const char *plain_path = STOW_SOURCE_DIR "/bench/traces/resnet50_train.rep";
    size_t text_len, gz_len;
    char *text = read_all(plain_path, &text_len);
    unsigned char *gz = gzip_bytes(text, text_len, 1, &gz_len);
    char err[512], want[700];
    stow_trace_t *t = UNTOUCHED;

    char cut[] = "/tmp/stow_trace_gz_XXXXXX";
    write_bytes(cut, gz, gz_len / 2);
    cr_assert_eq(stow_trace_load(cut, &t, err, sizeof err), STOW_EPARSE);
    cr_assert_eq(t, UNTOUCHED);
    char *colon = strchr(err + strlen(cut) + 1, ':');
    cr_assert_not_null(colon, "%s", err);
    unsigned long line = strtoul(err + strlen(cut) + 1, NULL, 10);
    cr_assert(line > 1000 && line < 9711, "line %lu: %s", line, err);
    size_t got = (size_t)strtoull(strstr(err, "compressed bytes, ") + 18, NULL, 10);
    cr_assert(got > 0 && got < text_len, "%s", err);
    snprintf(want, sizeof want,
             "%s:%lu: truncated gzip stream: the file ends after %zu compressed bytes, %zu bytes "
             "into the trace",
             cut, line, gz_len / 2, got);
    cr_assert_str_eq(err, want);
    /* The lines that came are whole up to the one reported. */
    size_t lines = 1;
    for (size_t i = 0; i < got; i++)
        lines += text[i] == '\n';
    cr_assert_eq(lines, line);
    unlink(cut);

    /* The gzip header alone: cut before any data. */
    char head[] = "/tmp/stow_trace_gz_XXXXXX";
    write_bytes(head, gz, 10);
    cr_assert_eq(stow_trace_load(head, &t, err, sizeof err), STOW_EPARSE);
    snprintf(want, sizeof want,
             "%s:1: truncated gzip stream: the file ends after 10 compressed bytes, 0 bytes into "
             "the trace",
             head);
    cr_assert_str_eq(err, want);
    unlink(head);

    /* A damaged block: the first byte of the deflate data (after the 10-byte header) set to
     * the reserved block type 3. */
    unsigned char *bad = malloc(gz_len);
    cr_assert_not_null(bad);
    memcpy(bad, gz, gz_len);
    bad[10] = 0x07;
    char corrupt[] = "/tmp/stow_trace_gz_XXXXXX";
    write_bytes(corrupt, bad, gz_len);
    cr_assert_eq(stow_trace_load(corrupt, &t, err, sizeof err), STOW_EPARSE);
    snprintf(want, sizeof want,
             "%s:1: corrupt gzip stream at compressed byte 11 of %zu (zlib: invalid block type)",
             corrupt, gz_len);
    cr_assert_str_eq(err, want);
    unlink(corrupt);

    /* A wrong checksum in the trailer: all the text came, and none of it is trusted. */
    memcpy(bad, gz, gz_len);
    bad[gz_len - 8] ^= 0xff;
    char crc[] = "/tmp/stow_trace_gz_XXXXXX";
    write_bytes(crc, bad, gz_len);
    cr_assert_eq(stow_trace_load(crc, &t, err, sizeof err), STOW_EPARSE);
    cr_assert(strstr(err, "corrupt gzip stream") && strstr(err, "(zlib: incorrect data check)"),
              "%s", err);
    cr_assert_eq(strncmp(err, crc, strlen(crc)), 0, "%s", err);
    unlink(crc);

    /* Bytes after the end that are not another member. */
    unsigned char *tail = malloc(gz_len + 5);
    cr_assert_not_null(tail);
    memcpy(tail, gz, gz_len);
    memcpy(tail + gz_len, "junk\n", 5);
    char trailing[] = "/tmp/stow_trace_gz_XXXXXX";
    write_bytes(trailing, tail, gz_len + 5);
    cr_assert_eq(stow_trace_load(trailing, &t, err, sizeof err), STOW_EPARSE);
    snprintf(want, sizeof want,
             "%s:9713: corrupt gzip stream: 5 bytes after its end (compressed byte %zu of %zu) "
             "are not gzip",
             trailing, gz_len, gz_len + 5);
    cr_assert_str_eq(err, want);
    cr_assert_eq(t, UNTOUCHED);
    unlink(trailing);
    free(tail);
    free(bad);
    free(gz);
    free(text);
}

#else /* !STOW_HAVE_ZLIB */

/* Without zlib a compressed trace is refused with what is missing, never parsed as text. */
Test(trace, gzip_trace_without_zlib_says_so)
{
    /* "0 0\n" as Python's gzip.compress(..., mtime=0) writes it. */
    static const unsigned char gz[] = {0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00,
                                       0x02, 0x03, 0x33, 0x50, 0x30, 0xe0, 0x02, 0x00,
                                       0xb0, 0xbe, 0xb1, 0xd6, 0x04, 0x00, 0x00, 0x00};
    char path[] = "/tmp/stow_trace_gz_XXXXXX";
    write_bytes(path, gz, sizeof gz);
    stow_trace_t *t = UNTOUCHED;
    char err[512];
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_EPARSE);
    cr_assert(strstr(err, "gzip-compressed, and this build of Stowage has no zlib"), "%s", err);
    cr_assert_eq(t, UNTOUCHED);
    unlink(path);
    (void)read_all;
}

#endif

/* ---- shared real traces (../shared/traces/README.md) ---- */

typedef struct shared_case {
    const char *name;
    size_t events;
    uint64_t peak_live_bytes;
} shared_case_t;

static const shared_case_t shared_cases[] = {
    {"gpt2_train.rep", 12355, 13594206920ull},
    {"resnet50_train.rep", 9711, 6057040912ull},
    {"resnet_multiscale_train.rep", 19451, 5633218960ull},
    {"vit_train.rep", 9499, 5749363552ull},
    {"gpt2_generate.rep", 395180, 1106856728ull},
};

Test(trace, shared_traces_match_readme)
{
    unsigned found = 0;
    for (size_t k = 0; k < sizeof shared_cases / sizeof shared_cases[0]; k++) {
        const shared_case_t *c = &shared_cases[k];
        char buf[1024];
        const char *path = ts_shared_trace(c->name, buf, sizeof buf);
        if (!path)
            continue;
        found++;
        stow_trace_t *t = NULL;
        char err[512];
        cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_OK, "%s: %s", c->name, err);
        cr_assert_eq(t->event_count, c->events, "%s", c->name);
        cr_assert_eq(t->peak_live_bytes, c->peak_live_bytes, "%s", c->name);
        cr_assert_eq(t->stream_count, 1, "%s: one stream", c->name);
        /* Dense ids, each allocated exactly once, never freed before. */
        size_t allocs = 0;
        uint64_t live = 0, peak = 0;
        for (size_t i = 0; i < t->event_count; i++) {
            const stow_trace_event_t *e = &t->events[i];
            cr_assert_lt(e->id, t->id_count);
            if (e->kind == STOW_TRACE_ALLOC) {
                allocs++;
                live += e->size_bytes;
            } else {
                live -= e->size_bytes;
            }
            if (live > peak)
                peak = live;
        }
        cr_assert_eq(allocs, t->id_count, "%s", c->name);
        cr_assert_eq(peak, t->peak_live_bytes, "%s", c->name);
        stow_trace_free(t);
    }
    if (!found)
        cr_skip_test("no shared traces under " STOW_SHARED_DIR "/traces");
}
