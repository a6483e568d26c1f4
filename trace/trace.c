/*
 * trace/trace.c: reader of the .rep allocation-trace format (stowage/trace.h).
 *
 * Owns parsing and validation only; it never touches a pool. Every rejection
 * names the file, the line and the reason, because users feed it traces
 * recorded elsewhere and must be able to find the broken line. Input that
 * begins with the gzip magic bytes is decompressed first (trace/gz.c).
 */
#include "stowage/trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "trace/gz.h"

/* Ids are stored as uint32_t and streams as uint16_t in each event. */
#define TRACE_MAX_IDS ((uint64_t)UINT32_MAX)
#define TRACE_MAX_STREAMS 65536u

typedef struct parser {
    const char *name;
    const char *cursor;
    const char *end;
    size_t line;
    char *err;
    size_t err_len;
} parser_t;

static stow_status_t parse_error(parser_t *p, const char *fmt, ...)
{
    if (p->err && p->err_len > 0) {
        int n = snprintf(p->err, p->err_len, "%s:%zu: ", p->name, p->line);
        if (n >= 0 && (size_t)n < p->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + n, p->err_len - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return STOW_EPARSE;
}

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Returns the next line's [begin, end) without its newline; false at EOF. */
static bool next_line(parser_t *p, const char **begin, const char **end)
{
    if (p->cursor >= p->end)
        return false;
    const char *nl = memchr(p->cursor, '\n', (size_t)(p->end - p->cursor));
    *begin = p->cursor;
    *end = nl ? nl : p->end;
    p->cursor = nl ? nl + 1 : p->end;
    p->line++;
    return true;
}

static void skip_blanks(const char **s, const char *end)
{
    while (*s < end && is_blank(**s))
        (*s)++;
}

/* What is wrong with a numeric field, each with its own message. */
typedef enum { NUM_OK, NUM_MISSING, NUM_NEGATIVE, NUM_OVERFLOW, NUM_NOT_NUMBER } num_status_t;

static const char *num_reason(num_status_t r)
{
    return r == NUM_NEGATIVE   ? "is negative"
           : r == NUM_OVERFLOW ? "is beyond 2^64 - 1"
                               : "is not a decimal number";
}

/* Reads the next blank-separated field as an unsigned decimal: *tok and *len
 * hold the field (for messages); *s moves past it only when it is a number. */
static num_status_t read_u64(const char **s, const char *end, uint64_t *out, const char **tok,
                             int *len)
{
    skip_blanks(s, end);
    const char *q = *s, *t = q;
    if (q >= end)
        return NUM_MISSING;
    while (t < end && !is_blank(*t))
        t++;
    *tok = q;
    *len = (int)(t - q > 40 ? 40 : t - q);
    const char *digits = *q == '-' ? q + 1 : q;
    if (digits == t)
        return NUM_NOT_NUMBER;
    for (const char *c = digits; c < t; c++)
        if (*c < '0' || *c > '9')
            return NUM_NOT_NUMBER;
    if (digits != q)
        return NUM_NEGATIVE;
    uint64_t v = 0;
    for (; q < t; q++) {
        unsigned digit = (unsigned)(*q - '0');
        if (v > (UINT64_MAX - digit) / 10)
            return NUM_OVERFLOW;
        v = v * 10 + digit;
    }
    *s = t;
    *out = v;
    return NUM_OK;
}

static bool at_line_end(const char *s, const char *end)
{
    skip_blanks(&s, end);
    return s == end;
}

static bool is_skippable(const char *b, const char *e)
{
    skip_blanks(&b, e);
    return b == e || *b == '#';
}

typedef struct id_state {
    uint64_t size_bytes; /* 0 until allocated */
    uint16_t stream;
    uint8_t state; /* 0 unseen, 1 live, 2 freed */
} id_state_t;

static stow_status_t parse_header(parser_t *p, uint64_t *ids, uint64_t *events)
{
    /* Memory for events is sized from the header, so the count is checked
     * against the text first: every event line takes at least 4 bytes
     * ("f 0\n"). The id table grows with the ids actually seen. */
    const char *b, *e;
    if (p->cursor == p->end) {
        if (p->err && p->err_len > 0)
            snprintf(p->err, p->err_len,
                     "%s: the file is empty; a trace starts with the header '<number of ids> "
                     "<number of events>'",
                     p->name);
        return STOW_EPARSE;
    }
    do {
        if (!next_line(p, &b, &e))
            return parse_error(p, "empty trace: missing header '<ids> <events>'");
    } while (is_skippable(b, e));
    static const char *const fields[] = {"<number of ids>", "<number of events>"};
    uint64_t *values[] = {ids, events};
    for (int k = 0; k < 2; k++) {
        const char *tok = b;
        int len = 0;
        num_status_t r = read_u64(&b, e, values[k], &tok, &len);
        if (r == NUM_MISSING)
            return parse_error(p, "the header ends before its %s (header must be '<number of "
                                  "ids> <number of events>')",
                               fields[k]);
        if (r != NUM_OK)
            return parse_error(p, "%s '%.*s' %s (header must be '<number of ids> <number of "
                                  "events>')",
                               k == 0 ? "number of ids" : "number of events", len, tok,
                               num_reason(r));
    }
    if (!at_line_end(b, e))
        return parse_error(p, "header must be '<number of ids> <number of events>'");
    if (*ids > TRACE_MAX_IDS)
        return parse_error(p, "too many ids (%llu, at most %llu)", (unsigned long long)*ids,
                           (unsigned long long)TRACE_MAX_IDS);
    /* An id is allocated and freed at most once. */
    if (*events > 2 * *ids)
        return parse_error(p, "header announces %llu events for %llu ids (at most 2 per id)",
                           (unsigned long long)*events, (unsigned long long)*ids);
    size_t remaining = (size_t)(p->end - p->cursor);
    if (*events > remaining / 4 + 1)
        return parse_error(p, "header announces %llu events; the file is too short for them",
                           (unsigned long long)*events);
    return STOW_OK;
}

/* The trace's markers and keys as they are read (moved into the trace at the
 * end). Keys are interned through an open-addressing table of their indexes,
 * so that a trace with many distinct keys (shape buckets) stays linear. */
typedef struct marker_list {
    stow_trace_marker_t *v;
    size_t count, capacity;
    char **keys;
    uint32_t key_count;
    uint32_t *slots;   /* 1 + key index, 0 = empty; slot_count is a power of two */
    size_t slot_count; /* at least twice key_count */
} marker_list_t;

static void marker_list_free(marker_list_t *m)
{
    for (uint32_t i = 0; i < m->key_count; i++)
        free(m->keys[i]);
    free(m->keys);
    free(m->slots);
    free(m->v);
}

static size_t key_hash(const char *key, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)key[i]) * 1099511628211ull;
    return (size_t)h;
}

/* Doubles the key arrays and rebuilds the table; false without host memory. */
static bool keys_grow(marker_list_t *m)
{
    size_t n = m->slot_count ? 2 * m->slot_count : 16;
    uint32_t *slots = calloc(n, sizeof *slots);
    char **keys = slots ? realloc(m->keys, (n / 2) * sizeof *keys) : NULL;
    if (!keys) {
        free(slots);
        return false;
    }
    m->keys = keys;
    for (uint32_t i = 0; i < m->key_count; i++) {
        size_t j = key_hash(keys[i], strlen(keys[i])) & (n - 1);
        while (slots[j])
            j = (j + 1) & (n - 1);
        slots[j] = i + 1;
    }
    free(m->slots);
    m->slots = slots;
    m->slot_count = n;
    return true;
}

/* The index of key[0 .. len) among the keys, added when new; UINT32_MAX
 * without host memory. */
static uint32_t intern_key(marker_list_t *m, const char *key, size_t len)
{
    if (2 * ((size_t)m->key_count + 1) > m->slot_count && !keys_grow(m))
        return UINT32_MAX;
    size_t j = key_hash(key, len) & (m->slot_count - 1);
    for (; m->slots[j]; j = (j + 1) & (m->slot_count - 1)) {
        const char *k = m->keys[m->slots[j] - 1];
        if (!strncmp(k, key, len) && k[len] == '\0')
            return m->slots[j] - 1;
    }
    char *copy = malloc(len + 1);
    if (!copy)
        return UINT32_MAX;
    memcpy(copy, key, len);
    copy[len] = '\0';
    m->keys[m->key_count] = copy;
    m->slots[j] = m->key_count + 1;
    return m->key_count++;
}

/* 'm KEY' or 'e' (b at the letter). */
static stow_status_t parse_marker(parser_t *p, const char *b, const char *e, size_t before_event,
                                  marker_list_t *m)
{
    char kind = *b++;
    uint32_t key = STOW_TRACE_STEP_END;
    if (kind == 'e') {
        if (!at_line_end(b, e))
            return parse_error(p, "a step end must be 'e' alone");
    } else {
        if (b >= e || !is_blank(*b))
            return parse_error(p, "a step marker must be 'm <key>'");
        skip_blanks(&b, e);
        const char *k = b;
        while (b < e && !is_blank(*b))
            b++;
        size_t len = (size_t)(b - k);
        if (len == 0)
            return parse_error(p, "a step marker must be 'm <key>'");
        if (!at_line_end(b, e))
            return parse_error(p, "a step marker has one key and nothing after it");
        if (len > STOW_STEP_KEY_MAX)
            return parse_error(p, "step key of %zu characters (at most %d)", len,
                               STOW_STEP_KEY_MAX);
        if (!stow_step_key_valid(k, len))
            return parse_error(p, "step key '%.*s': only letters, digits and _.:/- are allowed",
                               (int)len, k);
        key = intern_key(m, k, len);
        if (key == UINT32_MAX)
            return STOW_EHOSTMEM;
    }
    if (m->count == m->capacity) {
        size_t cap = m->capacity ? 2 * m->capacity : 64;
        stow_trace_marker_t *grown = realloc(m->v, cap * sizeof *grown);
        if (!grown)
            return STOW_EHOSTMEM;
        m->v = grown;
        m->capacity = cap;
    }
    m->v[m->count++] = (stow_trace_marker_t){before_event, key};
    return STOW_OK;
}

static bool is_marker(const char *b, const char *e)
{
    skip_blanks(&b, e);
    return b < e && (*b == 'm' || *b == 'e');
}

typedef struct id_table {
    id_state_t *v;
    size_t capacity; /* entries allocated; ids below it are valid indexes */
} id_table_t;

/* Makes room for `id`; false when out of host memory. */
static bool id_table_reserve(id_table_t *ids, uint64_t id)
{
    if (id < ids->capacity)
        return true;
    size_t cap = ids->capacity ? ids->capacity : 1024;
    while (cap <= id)
        cap *= 2;
    id_state_t *grown = realloc(ids->v, cap * sizeof *grown);
    if (!grown)
        return false;
    memset(grown + ids->capacity, 0, (cap - ids->capacity) * sizeof *grown);
    ids->v = grown;
    ids->capacity = cap;
    return true;
}

static stow_status_t parse_event(parser_t *p, const char *b, const char *e, stow_trace_t *t,
                                 id_table_t *ids, uint64_t *live_bytes)
{
    skip_blanks(&b, e);
    char kind = *b++;
    uint64_t id, size = 0, stream = 0;
    const char *form = kind == 'a' ? "'a <id> <size> <stream>'" : "'f <id>'";
    if ((kind != 'a' && kind != 'f') || (b < e && !is_blank(*b)))
        return parse_error(p, "expected 'a <id> <size> <stream>' or 'f <id>'");
    const char *tok = b;
    int len = 0;
    num_status_t r = read_u64(&b, e, &id, &tok, &len);
    if (r == NUM_MISSING)
        return parse_error(p, "the line ends before its <id>: expected %s", form);
    if (r != NUM_OK)
        return parse_error(p, "id '%.*s' %s", len, tok, num_reason(r));
    if (id >= t->id_count)
        return parse_error(p, "id %llu out of range (header says %u ids)",
                           (unsigned long long)id, t->id_count);
    /* Dense ids grow with the events; one far beyond them would make the table
     * (16 bytes an id) huge for a tiny file, so it is refused. */
    if (id >= ids->capacity && id > 2 * (uint64_t)t->event_count + ((uint64_t)1 << 20))
        return parse_error(p, "id %llu is far beyond the %zu events read so far (ids must be "
                              "dense and 0-based)",
                           (unsigned long long)id, t->event_count);
    if (!id_table_reserve(ids, id))
        return STOW_EHOSTMEM;
    id_state_t *st = &ids->v[id];
    stow_trace_event_t *ev = &t->events[t->event_count];
    if (kind == 'a') {
        static const char *const names[] = {"size", "stream"};
        uint64_t *values[] = {&size, &stream};
        for (int k = 0; k < 2; k++) {
            r = read_u64(&b, e, values[k], &tok, &len);
            if (r == NUM_MISSING)
                return parse_error(p, "allocation %llu: the line ends before its <%s>: expected %s",
                                   (unsigned long long)id, names[k], form);
            if (r != NUM_OK)
                return parse_error(p, "allocation %llu: %s '%.*s' %s (%s)",
                                   (unsigned long long)id, names[k], len, tok, num_reason(r),
                                   k == 0 ? "sizes are 1 to 2^62 bytes" : "streams are 0 to 65535");
        }
        if (!at_line_end(b, e))
            return parse_error(p, "allocation must be 'a <id> <size> <stream>'");
        if (size == 0)
            return parse_error(p, "allocation %llu has size 0", (unsigned long long)id);
        if (size > STOW_TRACE_MAX_SIZE_BYTES)
            return parse_error(p, "allocation %llu: size %llu is absurd (more than 2^62)",
                               (unsigned long long)id, (unsigned long long)size);
        if (stream >= TRACE_MAX_STREAMS)
            return parse_error(p, "stream index %llu too large", (unsigned long long)stream);
        if (st->state != 0)
            return parse_error(p, "id %llu allocated twice", (unsigned long long)id);
        st->state = 1;
        st->size_bytes = size;
        st->stream = (uint16_t)stream;
        *live_bytes += size; /* <= 2^32 ids x 2^62: no overflow */
        if (stream + 1 > t->stream_count)
            t->stream_count = (uint32_t)stream + 1;
    } else {
        if (!at_line_end(b, e))
            return parse_error(p, "free must be 'f <id>'");
        if (st->state == 0)
            return parse_error(p, "id %llu freed before it was allocated",
                               (unsigned long long)id);
        if (st->state == 2)
            return parse_error(p, "id %llu freed twice", (unsigned long long)id);
        st->state = 2;
        *live_bytes -= st->size_bytes;
    }
    ev->kind = (uint8_t)kind;
    ev->id = (uint32_t)id;
    ev->size_bytes = st->size_bytes;
    ev->stream = st->stream;
    ev->reserved_ = 0;
    return STOW_OK;
}

static stow_status_t parse_text(const char *name, const char *text, size_t text_len,
                                stow_trace_t **out, char *err, size_t err_len)
{
    parser_t p = {name, text, text + text_len, 0, err, err_len};
    uint64_t id_count, event_count;
    stow_status_t st = parse_header(&p, &id_count, &event_count);
    if (st != STOW_OK)
        return st;

    stow_trace_t *t = calloc(1, sizeof *t);
    id_table_t ids = {NULL, 0};
    if (t)
        t->events = malloc((event_count ? event_count : 1) * sizeof *t->events);
    if (t)
        t->path = strdup(name);
    if (!t || !t->events || !t->path) {
        stow_trace_free(t);
        return STOW_EHOSTMEM;
    }
    t->id_count = (uint32_t)id_count;
    t->stream_count = 1;

    uint64_t live_bytes = 0;
    marker_list_t markers = {NULL, 0, 0, NULL, 0, NULL, 0};
    const char *b, *e;
    while (next_line(&p, &b, &e)) {
        if (is_skippable(b, e))
            continue;
        if (is_marker(b, e)) {
            skip_blanks(&b, e);
            st = parse_marker(&p, b, e, t->event_count, &markers);
            if (st != STOW_OK)
                break;
            continue;
        }
        if (t->event_count == event_count) {
            st = parse_error(&p, "more events than the header's %llu",
                             (unsigned long long)event_count);
            break;
        }
        st = parse_event(&p, b, e, t, &ids, &live_bytes);
        if (st != STOW_OK)
            break;
        t->event_count++;
        if (live_bytes > t->peak_live_bytes) {
            t->peak_live_bytes = live_bytes;
            t->peak_live_event = t->event_count - 1;
        }
    }
    if (st == STOW_OK && t->event_count != event_count)
        st = parse_error(&p, "header announces %llu events, file has %zu",
                         (unsigned long long)event_count, t->event_count);
    free(ids.v);
    if (st != STOW_OK) {
        marker_list_free(&markers);
        stow_trace_free(t);
        return st;
    }
    t->markers = markers.v;
    t->marker_count = markers.count;
    t->keys = markers.keys;
    t->key_count = markers.key_count;
    free(markers.slots);
    *out = t;
    return STOW_OK;
}

stow_status_t stow_trace_parse(const char *name, const char *text, size_t text_len,
                               stow_trace_t **out, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!name || (!text && text_len) || !out)
        return STOW_EINVAL;
    if (!stow__gz_is(text, text_len))
        return parse_text(name, text, text_len, out, err, err_len);
    /* Compressed (trace/gz.h): line numbers are those of the decompressed text. */
    char *plain = NULL;
    size_t plain_len = 0;
    stow_status_t st = stow__gz_inflate(name, text, text_len, &plain, &plain_len, err, err_len);
    if (st == STOW_OK)
        st = parse_text(name, plain, plain_len, out, err, err_len);
    free(plain);
    return st;
}

stow_status_t stow_trace_load(const char *path, stow_trace_t **out, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!path || !out)
        return STOW_EINVAL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (err && err_len)
            snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return STOW_EIO;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (err && err_len)
            snprintf(err, err_len, "%s: is a directory, not a trace file", path);
        fclose(f);
        return STOW_EIO;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    stow_status_t st = STOW_OK;
    for (;;) {
        if (cap - len < 65536) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            char *n = realloc(text, ncap);
            if (!n) {
                st = STOW_EHOSTMEM;
                break;
            }
            text = n;
            cap = ncap;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (st == STOW_OK && ferror(f)) {
        if (err && err_len)
            snprintf(err, err_len, "%s: read error", path);
        st = STOW_EIO;
    }
    fclose(f);
    if (st == STOW_OK)
        st = stow_trace_parse(path, text, len, out, err, err_len);
    free(text);
    return st;
}

void stow_trace_free(stow_trace_t *trace)
{
    if (!trace)
        return;
    for (uint32_t i = 0; i < trace->key_count; i++)
        free(trace->keys[i]);
    free(trace->keys);
    free(trace->markers);
    free(trace->events);
    free(trace->path);
    free(trace);
}
