/*
 * trace/gz.h: gzip-compressed input for the readers of traces and tags
 * (trace/gz.c). Internal: the CLI's readers link it from the library.
 *
 * A file is gzip-compressed when it begins with the magic bytes 1f 8b,
 * whatever its name; a plain trace or tags file cannot begin with them.
 * Thread safety: reentrant.
 */
#ifndef STOWAGE_TRACE_GZ_H
#define STOWAGE_TRACE_GZ_H

#include <stdbool.h>
#include <stddef.h>

#include "stowage/status.h"

/* True when data[0 .. len) begins with the gzip magic bytes. */
bool stow__gz_is(const void *data, size_t len);

/*
 * Decompresses the gzip stream data[0 .. len), one member or several
 * concatenated (as `cat a.gz b.gz` makes), into a malloc'ed buffer *out of
 * *out_len bytes, with one NUL byte after them.
 * pre: stow__gz_is(data, len).
 * Errors name the input and the line of the decompressed text the stream broke
 * off in, "NAME:LINE: reason": STOW_EPARSE when the stream is corrupt (bad
 * header, bad block, checksum or length mismatch, bytes after the end that are
 * not another member), truncated, or this build has no zlib; STOW_EHOSTMEM.
 * *out and *out_len are untouched on error.
 * Ownership: the caller frees *out.
 */
stow_status_t stow__gz_inflate(const char *name, const void *data, size_t len, char **out,
                               size_t *out_len, char *err, size_t err_len);

#endif /* STOWAGE_TRACE_GZ_H */
