/*
 * trace/gz.c: gzip decompression for the trace and tags readers (trace/gz.h).
 *
 * Owns the inflate loop and its messages only; the readers parse what comes
 * out. zlib is linked only where the trace reader is built (the library); a
 * build without it (STOW_HAVE_ZLIB unset) still names a compressed input and
 * says what is missing instead of parsing its bytes as text.
 */
#include "trace/gz.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef STOW_HAVE_ZLIB
#include <zlib.h>
#endif

bool stow__gz_is(const void *data, size_t len)
{
    const unsigned char *b = data;
    return len >= 2 && b[0] == 0x1f && b[1] == 0x8b;
}

/* The line of the decompressed text that holds its end: where the stream broke off. */
static size_t gz_line_at_end(const char *text, size_t len)
{
    size_t line = 1;
    for (const char *p = text, *end = text + len; (p = memchr(p, '\n', (size_t)(end - p)));
         p++)
        line++;
    return line;
}

#ifdef STOW_HAVE_ZLIB

stow_status_t stow__gz_inflate(const char *name, const void *data, size_t len, char **out,
                               size_t *out_len, char *err, size_t err_len)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    /* 16 + MAX_WBITS: a gzip header and trailer (CRC-32 and length checked), not zlib's. */
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
        snprintf(err, err_len, "%s: out of host memory", name);
        return STOW_EHOSTMEM;
    }
    const unsigned char *in = data;
    size_t in_pos = 0;
    /* Traces compress 3 to 8 times; one extra byte keeps room for the NUL. */
    size_t cap = len < SIZE_MAX / 8 ? len * 4 + 65536 : SIZE_MAX / 2;
    size_t used = 0;
    char *text = malloc(cap);
    stow_status_t st = text ? STOW_OK : STOW_EHOSTMEM;
    const char *why = NULL; /* a corrupt stream: zlib's reason */
    bool truncated = false, trailing = false;
    while (st == STOW_OK) {
        if (cap - used < 2) {
            if (cap > SIZE_MAX / 2) {
                st = STOW_EHOSTMEM;
                break;
            }
            char *grown = realloc(text, cap * 2);
            if (!grown) {
                st = STOW_EHOSTMEM;
                break;
            }
            text = grown;
            cap *= 2;
        }
        /* zlib counts in uInt: feed and drain at most UINT_MAX bytes a call. */
        size_t in_left = len - in_pos, out_room = cap - used - 1;
        zs.next_in = (Bytef *)(uintptr_t)(in + in_pos);
        zs.avail_in = (uInt)(in_left < UINT_MAX ? in_left : UINT_MAX);
        zs.next_out = (Bytef *)(text + used);
        zs.avail_out = (uInt)(out_room < UINT_MAX ? out_room : UINT_MAX);
        uInt fed = zs.avail_in, room = zs.avail_out;
        int rc = inflate(&zs, Z_NO_FLUSH);
        in_pos += fed - zs.avail_in;
        used += room - zs.avail_out;
        if (rc == Z_STREAM_END) {
            if (in_pos == len)
                break;
            /* Another member follows, or bytes that are not gzip. */
            if (!stow__gz_is(in + in_pos, len - in_pos)) {
                trailing = true;
                st = STOW_EPARSE;
                break;
            }
            if (inflateReset(&zs) != Z_OK)
                st = STOW_EHOSTMEM;
        } else if (rc == Z_MEM_ERROR) {
            st = STOW_EHOSTMEM;
        } else if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT || rc == Z_STREAM_ERROR) {
            why = zs.msg ? zs.msg : "bad data";
            st = STOW_EPARSE;
        } else if (rc == Z_BUF_ERROR) {
            /* No progress with output room left: the input ran out mid-stream. */
            truncated = in_pos == len;
            why = "no progress";
            st = STOW_EPARSE;
        }
    }
    inflateEnd(&zs);
    if (st != STOW_OK) {
        size_t line = text ? gz_line_at_end(text, used) : 1;
        if (st == STOW_EHOSTMEM)
            snprintf(err, err_len, "%s: out of host memory after %zu decompressed bytes", name,
                     used);
        else if (truncated)
            snprintf(err, err_len,
                     "%s:%zu: truncated gzip stream: the file ends after %zu compressed bytes, "
                     "%zu bytes into the trace",
                     name, line, len, used);
        else if (trailing)
            snprintf(err, err_len,
                     "%s:%zu: corrupt gzip stream: %zu bytes after its end (compressed byte %zu "
                     "of %zu) are not gzip",
                     name, line, len - in_pos, in_pos, len);
        else
            snprintf(err, err_len,
                     "%s:%zu: corrupt gzip stream at compressed byte %zu of %zu (zlib: %s)", name,
                     line, in_pos, len, why);
        free(text);
        return st;
    }
    text[used] = '\0';
    *out = text;
    *out_len = used;
    return STOW_OK;
}

#else /* !STOW_HAVE_ZLIB */

stow_status_t stow__gz_inflate(const char *name, const void *data, size_t len, char **out,
                               size_t *out_len, char *err, size_t err_len)
{
    (void)data, (void)len, (void)out, (void)out_len, (void)gz_line_at_end;
    snprintf(err, err_len,
             "%s:1: gzip-compressed, and this build of Stowage has no zlib (Debian: zlib1g-dev); "
             "decompress it first (gunzip -k)",
             name);
    return STOW_EPARSE;
}

#endif
