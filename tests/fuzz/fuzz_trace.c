/*
 * tests/fuzz/fuzz_trace.c: libFuzzer target for stow_trace_parse
 * (docs/reliability.md).
 *
 * Any input: the parser never crashes and never reads past text_len (the
 * buffer is an exact-size heap copy, so ASan sees one byte too far). STOW_OK
 * only for a trace that satisfies the format's invariants (stowage/trace.h),
 * recomputed here independently of the parser: ids < id_count, each id
 * allocated at most once and freed at most once after its allocation, a free
 * carries its allocation's size and stream, sizes > 0, stream_count = 1 +
 * largest stream, peak_live_bytes / peak_live_event as defined; markers in
 * file order, each before an event that exists (or at the end), naming a key
 * that exists and follows the key rule, keys distinct. On error the
 * message is NUL-terminated and names the input, and *out is untouched.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stowage/trace.h"
#include "tests/fuzz/fuzz_check.h"




static unsigned long long ft_inputs, ft_accepted;

static void ft_report(void)
{
    fprintf(stderr, "fuzz_trace totals: inputs=%llu accepted=%llu\n", ft_inputs, ft_accepted);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    atexit(ft_report);
    return 0;
}

static void ft_check_trace(const stow_trace_t *t)
{
    FUZZ_CHECK(t->path && strcmp(t->path, "fuzz") == 0, "path");
    FUZZ_CHECK(t->event_count <= 2 * (uint64_t)t->id_count, "events %zu ids %u", t->event_count,
             t->id_count);
    /* The shadow is sized by the ids the events use, not by the header: a
     * header may announce billions of ids that never appear. */
    size_t n_ids = 1;
    for (size_t i = 0; i < t->event_count; i++) {
        FUZZ_CHECK(t->events[i].id < t->id_count, "event %zu: id out of range", i);
        if ((size_t)t->events[i].id + 1 > n_ids)
            n_ids = (size_t)t->events[i].id + 1;
    }
    uint8_t *state = calloc(n_ids, 1);
    uint64_t *size = calloc(n_ids, sizeof *size);
    uint16_t *stream = calloc(n_ids, sizeof *stream);
    FUZZ_CHECK(state && size && stream, "host memory");
    uint64_t live = 0, peak = 0;
    size_t peak_event = 0;
    uint32_t streams = 1;
    for (size_t i = 0; i < t->event_count; i++) {
        const stow_trace_event_t *e = &t->events[i];
        FUZZ_CHECK(e->id < t->id_count, "event %zu: id %u", i, e->id);
        FUZZ_CHECK(e->reserved_ == 0, "event %zu: reserved_", i);
        if (e->kind == STOW_TRACE_ALLOC) {
            FUZZ_CHECK(state[e->id] == 0, "event %zu: id %u allocated twice", i, e->id);
            FUZZ_CHECK(e->size_bytes > 0 && e->size_bytes <= ((uint64_t)1 << 62), "event %zu: size",
                     i);
            state[e->id] = 1;
            size[e->id] = e->size_bytes;
            stream[e->id] = e->stream;
            live += e->size_bytes;
            if ((uint32_t)e->stream + 1 > streams)
                streams = (uint32_t)e->stream + 1;
        } else {
            FUZZ_CHECK(e->kind == STOW_TRACE_FREE, "event %zu: kind %d", i, e->kind);
            FUZZ_CHECK(state[e->id] == 1, "event %zu: free of id %u in state %d", i, e->id,
                     state[e->id]);
            FUZZ_CHECK(e->size_bytes == size[e->id] && e->stream == stream[e->id],
                     "event %zu: free carries another size/stream", i);
            state[e->id] = 2;
            live -= e->size_bytes;
        }
        if (live > peak) {
            peak = live;
            peak_event = i;
        }
    }
    FUZZ_CHECK(t->stream_count == streams, "stream_count %u, computed %u", t->stream_count, streams);
    FUZZ_CHECK((t->marker_count == 0) == (t->markers == NULL), "markers array");
    for (size_t m = 0; m < t->marker_count; m++) {
        const stow_trace_marker_t *mk = &t->markers[m];
        FUZZ_CHECK(mk->before_event <= t->event_count, "marker %zu after the end", m);
        FUZZ_CHECK(m == 0 || mk->before_event >= t->markers[m - 1].before_event,
                   "marker %zu out of order", m);
        FUZZ_CHECK(mk->key == STOW_TRACE_STEP_END || mk->key < t->key_count, "marker %zu key", m);
    }
    for (uint32_t k = 0; k < t->key_count; k++) {
        FUZZ_CHECK(stow_step_key_valid(t->keys[k], strlen(t->keys[k])), "key %u invalid", k);
        for (uint32_t j = 0; j < k; j++)
            FUZZ_CHECK(strcmp(t->keys[j], t->keys[k]), "keys %u and %u equal", j, k);
    }
    FUZZ_CHECK(t->peak_live_bytes == peak, "peak %llu, computed %llu",
             (unsigned long long)t->peak_live_bytes, (unsigned long long)peak);
    FUZZ_CHECK(peak == 0 || t->peak_live_event == peak_event, "peak event %zu, computed %zu",
             t->peak_live_event, peak_event);
    free(state);
    free(size);
    free(stream);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ft_inputs++;
    /* Exact-size copy: a read past text_len is a heap overflow under ASan. */
    char *text = malloc(size ? size : 1);
    FUZZ_CHECK(text != NULL, "host memory");
    if (size)
        memcpy(text, data, size);
    stow_trace_t *sentinel = (stow_trace_t *)(uintptr_t)0x1, *t = sentinel;
    char err[128];
    memset(err, 'x', sizeof err);
    stow_status_t st = stow_trace_parse("fuzz", text, size, &t, err, sizeof err);
    if (st == STOW_OK) {
        ft_accepted++;
        FUZZ_CHECK(t != sentinel && t != NULL, "out");
        ft_check_trace(t);
        stow_trace_free(t);
    } else {
        FUZZ_CHECK(st == STOW_EPARSE || st == STOW_EHOSTMEM, "status %d", (int)st);
        FUZZ_CHECK(t == sentinel, "out written on error");
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL, "error message not terminated");
        FUZZ_CHECK(st != STOW_EPARSE || strncmp(err, "fuzz:", 5) == 0, "message '%s'", err);
    }
    /* A tiny error buffer and no buffer at all are fine too. */
    char small[4];
    t = sentinel;
    st = stow_trace_parse("fuzz", text, size, &t, small, sizeof small);
    FUZZ_CHECK(st != STOW_OK || t != sentinel, "second parse");
    if (st == STOW_OK)
        stow_trace_free(t);
    else
        FUZZ_CHECK(memchr(small, '\0', sizeof small) != NULL, "small message not terminated");
    free(text);
    return 0;
}
