/*
 * importers/rmm_import.c: RMM's logging_resource_adaptor CSV to the .rep trace
 * format (contract: report/report.h). Strict: any row it cannot account for
 * is an error with its line, because a silently dropped free would turn into
 * a fake leak in every later analysis.
 */
#include "report/report.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Live pointers: open addressing, linear probing; key 0 = empty (RMM never
 * logs a null pointer for a successful allocation). */
typedef struct ptr_map {
    uint64_t *key;
    uint32_t *id;
    uint64_t *size;
    size_t cap, used; /* cap a power of two; used counts tombstones too */
} ptr_map_t;

#define TOMB UINT64_MAX

static size_t slot_of(const ptr_map_t *m, uint64_t k)
{
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (m->cap - 1);
}

static bool map_grow(ptr_map_t *m)
{
    ptr_map_t n = {NULL, NULL, NULL, m->cap ? m->cap * 2 : 1024, 0};
    n.key = calloc(n.cap, sizeof *n.key);
    n.id = malloc(n.cap * sizeof *n.id);
    n.size = malloc(n.cap * sizeof *n.size);
    if (!n.key || !n.id || !n.size) {
        free(n.key), free(n.id), free(n.size);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->key[i] || m->key[i] == TOMB)
            continue;
        size_t s = slot_of(&n, m->key[i]);
        while (n.key[s])
            s = (s + 1) & (n.cap - 1);
        n.key[s] = m->key[i], n.id[s] = m->id[i], n.size[s] = m->size[i];
        n.used++;
    }
    free(m->key), free(m->id), free(m->size);
    *m = n;
    return true;
}

/* The slot holding k, or SIZE_MAX. */
static size_t map_find(const ptr_map_t *m, uint64_t k)
{
    if (!m->cap)
        return SIZE_MAX;
    for (size_t s = slot_of(m, k);; s = (s + 1) & (m->cap - 1)) {
        if (!m->key[s])
            return SIZE_MAX;
        if (m->key[s] == k)
            return s;
    }
}

static bool map_put(ptr_map_t *m, uint64_t k, uint32_t id, uint64_t size)
{
    if ((m->used + 1) * 2 > m->cap && !map_grow(m))
        return false;
    size_t s = slot_of(m, k);
    while (m->key[s] && m->key[s] != TOMB)
        s = (s + 1) & (m->cap - 1);
    if (!m->key[s])
        m->used++;
    m->key[s] = k, m->id[s] = id, m->size[s] = size;
    return true;
}

/* The id under which a live allocation of 0 bytes is remembered: its free must
 * be matched like any other, but neither becomes an event. */
#define ZERO_SIZE_ID UINT32_MAX

typedef struct rmm_event {
    uint64_t size;
    uint32_t id;
    uint16_t stream;
    char kind;
} rmm_event_t;

static stow_status_t fail(char *err, size_t err_len, const char *name, size_t line,
                          const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(err, err_len, "%s:%zu: %s", name, line, msg);
    return STOW_EPARSE;
}

/* Splits a line into at most max comma-separated fields (trimmed, in place). */
static size_t split(char *s, char **field, size_t max)
{
    size_t n = 0;
    for (;;) {
        char *comma = strchr(s, ',');
        if (comma)
            *comma = 0;
        while (isspace((unsigned char)*s))
            s++;
        char *end = s + strlen(s);
        while (end > s && isspace((unsigned char)end[-1]))
            *--end = 0;
        if (n < max)
            field[n] = s;
        n++;
        if (!comma)
            return n;
        s = comma + 1;
    }
}

static bool parse_u64(const char *s, int base, uint64_t *out)
{
    if (!*s || *s == '-' || *s == '+' || isspace((unsigned char)*s))
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

/* Why parse_u64 refused s: each case its own reason. */
static const char *number_error(const char *s, int base)
{
    if (!*s)
        return "empty";
    const char *digits = base == 10 ? "0123456789" : "0123456789abcdefABCDEFxX";
    if (*s == '-' && s[1] && strspn(s + 1, digits) == strlen(s + 1))
        return "negative";
    errno = 0;
    char *end;
    (void)strtoull(*s == '+' ? s + 1 : s, &end, base);
    if (errno == ERANGE && !*end)
        return "beyond 2^64 - 1";
    return base == 10 ? "not a decimal number" : "not a number";
}

stow_status_t stow__rmm_import(const char *name, const char *text, size_t text_len, FILE *out,
                               stow_rmm_import_stats_t *stats, char *err, size_t err_len)
{
    stow_rmm_import_stats_t s;
    memset(&s, 0, sizeof s);
    ptr_map_t map = {NULL, NULL, NULL, 0, 0};
    rmm_event_t *ev = NULL;
    size_t ev_count = 0, ev_cap = 0;
    uint64_t streams[65536];
    uint32_t stream_count = 0, next_id = 0;
    stow_status_t st = STOW_OK;
    char *line = malloc(text_len + 1);
    if (!line)
        return STOW_EHOSTMEM;
    size_t lineno = 0, pos = 0;
    bool header = false;
    while (st == STOW_OK && pos < text_len) {
        size_t end = pos;
        while (end < text_len && text[end] != '\n')
            end++;
        memcpy(line, text + pos, end - pos);
        line[end - pos] = 0;
        pos = end + 1;
        lineno++;
        char *cr = strchr(line, '\r');
        if (cr)
            *cr = 0;
        char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (!*p)
            continue;
        char *f[6];
        size_t nf = split(p, f, 6);
        if (!header) {
            static const char *want[6] = {"Thread", "Time", "Action", "Pointer", "Size", "Stream"};
            bool ok = nf == 6;
            for (size_t i = 0; ok && i < 6; i++)
                ok = !strcmp(f[i], want[i]);
            if (!ok)
                st = fail(err, err_len, name, lineno,
                          "expected the header 'Thread,Time,Action,Pointer,Size,Stream'");
            header = true;
            continue;
        }
        if (nf != 6) {
            st = fail(err, err_len, name, lineno, "expected 6 fields, got %zu", nf);
            break;
        }
        uint64_t ptr, size, stream;
        if (!parse_u64(f[3], 0, &ptr)) {
            st = fail(err, err_len, name, lineno, "bad pointer '%s': %s", f[3],
                      number_error(f[3], 0));
            break;
        }
        if (!parse_u64(f[4], 10, &size)) {
            st = fail(err, err_len, name, lineno, "bad size '%s': %s", f[4],
                      number_error(f[4], 10));
            break;
        }
        if (size > STOW_TRACE_MAX_SIZE_BYTES) {
            /* The trace it writes could not hold it (the parser refuses it). */
            st = fail(err, err_len, name, lineno, "size %s is absurd (more than 2^62)", f[4]);
            break;
        }
        if (!parse_u64(f[5], 0, &stream)) {
            st = fail(err, err_len, name, lineno, "bad stream '%s': %s", f[5],
                      number_error(f[5], 0));
            break;
        }
        bool is_alloc = !strcmp(f[2], "allocate");
        bool is_free = !strcmp(f[2], "free");
        if (!strcmp(f[2], "allocate failure")) {
            s.failures++;
            continue;
        }
        if (!is_alloc && !is_free) {
            st = fail(err, err_len, name, lineno,
                      "unknown action '%s' (allocate, allocate failure, free)", f[2]);
            break;
        }
        if (size == 0 && ptr == 0) {
            /* A resource may return no memory for 0 bytes, and log both rows. */
            s.zero_size += is_alloc;
            continue;
        }
        size_t slot = map_find(&map, ptr);
        rmm_event_t e = {size, 0, 0, is_alloc ? 'a' : 'f'};
        if (is_alloc) {
            if (ptr == 0 || ptr == TOMB) {
                st = fail(err, err_len, name, lineno, "allocate of pointer %s", f[3]);
                break;
            }
            if (slot != SIZE_MAX) {
                if (map.id[slot] == ZERO_SIZE_ID)
                    st = fail(err, err_len, name, lineno,
                              "allocate of live pointer %s (a 0-byte allocation)", f[3]);
                else
                    st = fail(err, err_len, name, lineno, "allocate of live pointer %s (id %u)",
                              f[3], map.id[slot]);
                break;
            }
            if (size == 0) {
                if (!map_put(&map, ptr, ZERO_SIZE_ID, 0)) {
                    st = STOW_EHOSTMEM;
                    break;
                }
                s.zero_size++;
                continue;
            }
            if (next_id == ZERO_SIZE_ID) {
                st = fail(err, err_len, name, lineno, "more than %u allocations", ZERO_SIZE_ID - 1);
                break;
            }
            uint32_t k = 0;
            while (k < stream_count && streams[k] != stream)
                k++;
            if (k == stream_count) {
                if (stream_count == 65536) {
                    st = fail(err, err_len, name, lineno, "more than 65536 streams");
                    break;
                }
                streams[stream_count++] = stream;
            }
            e.id = next_id++;
            e.stream = (uint16_t)k;
            if (!map_put(&map, ptr, e.id, size)) {
                st = STOW_EHOSTMEM;
                break;
            }
            s.allocations++;
        } else {
            if (slot == SIZE_MAX) {
                st = fail(err, err_len, name, lineno, "free of unknown pointer %s", f[3]);
                break;
            }
            if (map.size[slot] != size) {
                st = fail(err, err_len, name, lineno,
                          "free of %s with size %" PRIu64 ", allocated with %" PRIu64, f[3], size,
                          map.size[slot]);
                break;
            }
            e.id = map.id[slot];
            map.key[slot] = TOMB;
            if (e.id == ZERO_SIZE_ID)
                continue;
            s.frees++;
        }
        if (ev_count == ev_cap) {
            size_t cap = ev_cap ? ev_cap * 2 : 4096;
            rmm_event_t *grown = realloc(ev, cap * sizeof *ev);
            if (!grown) {
                st = STOW_EHOSTMEM;
                break;
            }
            ev = grown, ev_cap = cap;
        }
        ev[ev_count++] = e;
    }
    if (st == STOW_OK && !header)
        st = fail(err, err_len, name, lineno ? lineno : 1, "empty file (no header)");
    if (st == STOW_OK) {
        fprintf(out, "%u %zu\n", next_id, ev_count);
        for (size_t i = 0; i < ev_count; i++) {
            if (ev[i].kind == 'a')
                fprintf(out, "a %u %" PRIu64 " %u\n", ev[i].id, ev[i].size, ev[i].stream);
            else
                fprintf(out, "f %u\n", ev[i].id);
        }
        if (ferror(out))
            st = STOW_EIO;
        s.streams = stream_count;
        s.still_live = s.allocations - s.frees;
        if (stats)
            *stats = s;
    }
    free(line);
    free(ev);
    free(map.key), free(map.id), free(map.size);
    return st;
}
