/*
 * report/report_tags.c: tag files, "<id> <tag text>" per line, that `stowage
 * report` and `stowage diff` read next to a trace (contract: report/report.h).
 * The parser works on memory, so that tests/fuzz/fuzz_tags.c can drive it
 * without the rest of the models. A file that begins with the gzip magic bytes
 * is decompressed first (trace/gz.h).
 */
#include "report/report.h"
#include "trace/gz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void stow__report_tags_free(const char **tags, uint32_t id_count)
{
    if (!tags)
        return;
    for (uint32_t i = 0; i < id_count; i++)
        free((void *)tags[i]);
    free(tags);
}

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }

/* One line of len bytes at s: blank, a '#' comment, or "<decimal id> <tag>".
 * Returns false with err filled on a malformed line or when out of host
 * memory. */
static bool parse_line(const char *name, unsigned lineno, const char *s, size_t len,
                       const char **tags, uint32_t id_count, char *err, size_t err_len)
{
    if (len && s[len - 1] == '\r')
        len--; /* CRLF */
    const char *end = s + len;
    if (memchr(s, '\0', len)) {
        snprintf(err, err_len, "%s:%u: NUL byte in the line", name, lineno);
        return false;
    }
    while (s < end && is_blank(*s))
        s++;
    if (s == end || *s == '#')
        return true;
    uint64_t id = 0;
    const char *digits = s;
    while (s < end && *s >= '0' && *s <= '9' && id < id_count)
        id = id * 10 + (uint64_t)(*s++ - '0');
    if (s == digits || id >= id_count || s == end || !is_blank(*s)) {
        snprintf(err, err_len, "%s:%u: expected '<id> <tag>' with id < %u", name, lineno, id_count);
        return false;
    }
    while (s < end && is_blank(*s))
        s++;
    char *tag = malloc((size_t)(end - s) + 1);
    if (!tag) {
        snprintf(err, err_len, "%s: out of host memory", name);
        return false;
    }
    memcpy(tag, s, (size_t)(end - s));
    tag[end - s] = '\0';
    free((void *)tags[id]);
    tags[id] = tag;
    return true;
}

const char **stow__report_tags_parse(const char *name, const char *text, size_t text_len,
                                     uint32_t id_count, char *err, size_t err_len)
{
    const char **tags = calloc(id_count ? id_count : 1, sizeof *tags);
    if (!tags) {
        snprintf(err, err_len, "%s: out of host memory", name);
        return NULL;
    }
    unsigned lineno = 0;
    for (size_t pos = 0; pos < text_len;) {
        const char *s = text + pos;
        const char *nl = memchr(s, '\n', text_len - pos);
        size_t len = nl ? (size_t)(nl - s) : text_len - pos;
        pos += len + 1;
        if (!parse_line(name, ++lineno, s, len, tags, id_count, err, err_len)) {
            stow__report_tags_free(tags, id_count);
            return NULL;
        }
    }
    return tags;
}

const char **stow__report_tags_load(const char *path, uint32_t id_count, char *err,
                                    size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open", path);
        return NULL;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    bool ok = true;
    for (;;) {
        if (len == cap) {
            size_t grown_cap = cap ? cap * 2 : 65536;
            char *grown = realloc(text, grown_cap);
            if (!grown) {
                snprintf(err, err_len, "%s: out of host memory", path);
                ok = false;
                break;
            }
            text = grown, cap = grown_cap;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f)) {
                snprintf(err, err_len, "%s: read error", path);
                ok = false;
            }
            break;
        }
    }
    fclose(f);
    if (ok && stow__gz_is(text, len)) {
        char *plain = NULL;
        size_t plain_len = 0;
        ok = stow__gz_inflate(path, text, len, &plain, &plain_len, err, err_len) == STOW_OK;
        free(text);
        text = plain, len = plain_len;
    }
    const char **tags = ok ? stow__report_tags_parse(path, text, len, id_count, err, err_len) : NULL;
    free(text);
    return tags;
}
