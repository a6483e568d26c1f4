/*
 * stowage/trace.h: allocation traces (the .rep format of ../shared/traces).
 *
 * Format, one event per line (the file may be gzip-compressed):
 *     <number of distinct allocation ids> <number of events>
 *     a <id> <size in bytes> <stream index>
 *     f <id>
 *     m <key>      a step with this key begins (stow_pool_step)
 *     e            the current step ends (stow_pool_step with NULL)
 * Ids are dense and 0-based; an id is allocated at most once and freed at most
 * once, after its allocation. Blank lines and lines starting with '#' are
 * ignored. Allocations never freed were live when the recording ended. Marker
 * lines (m, e) are not events: the header does not count them, and a key is 1
 * to STOW_STEP_KEY_MAX characters of [A-Za-z0-9_.:/-] (docs/trace_format.md).
 */
#ifndef STOWAGE_TRACE_H
#define STOWAGE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "stowage/status.h"
#include "stowage/step_key.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { STOW_TRACE_ALLOC = 'a', STOW_TRACE_FREE = 'f' } stow_trace_kind_t;

/* The largest allocation a trace may hold, 2^62 bytes: a size above it cannot
 * be a real device allocation, and rejecting it keeps every sum of sizes far
 * from overflow. The parser and the importers refuse larger sizes. */
#define STOW_TRACE_MAX_SIZE_BYTES ((uint64_t)1 << 62)

typedef struct stow_trace_event {
    uint64_t size_bytes; /* requested bytes (ALLOC); the allocation's size (FREE) */
    uint32_t id;         /* allocation id, < id_count */
    uint16_t stream;     /* stream index of the allocation (FREE: same as its ALLOC) */
    uint8_t kind;        /* stow_trace_kind_t */
    uint8_t reserved_;   /* zero */
} stow_trace_event_t;

/* A step marker: it comes before events[before_event] (event_count: after
 * the last event). key indexes stow_trace_t.keys, or is STOW_TRACE_STEP_END
 * for an 'e' line. Markers are in file order. */
#define STOW_TRACE_STEP_END UINT32_MAX
typedef struct stow_trace_marker {
    size_t before_event;
    uint32_t key;
} stow_trace_marker_t;

typedef struct stow_trace {
    char *path;                 /* as given to stow_trace_load */
    uint32_t id_count;          /* from the header */
    uint32_t stream_count;      /* 1 + largest stream index used */
    size_t event_count;         /* events[0 .. event_count) */
    stow_trace_event_t *events; /* owned by the trace */
    uint64_t peak_live_bytes;   /* max over time of the sum of live requested sizes */
    size_t peak_live_event;     /* index of the event after which that peak is first reached */
    size_t marker_count;        /* markers[0 .. marker_count): the m and e lines */
    stow_trace_marker_t *markers; /* owned by the trace; NULL when there are none */
    uint32_t key_count;         /* distinct keys of the m lines */
    char **keys;                /* keys[0 .. key_count), NUL-terminated, in order of first use */
} stow_trace_t;

/*
 * Reads and validates a trace file, plain or gzip-compressed: a file that
 * begins with the gzip magic bytes 1f 8b is decompressed first, whatever its
 * name (.rep.gz by custom), and its lines are those of the decompressed text.
 * On a malformed file returns STOW_EPARSE and writes "FILE:LINE: reason" into
 * err (always NUL-terminated when err_len > 0); a corrupt or truncated gzip
 * stream is STOW_EPARSE too, its LINE the one the stream broke off in, and so
 * is a compressed file where the library was built without zlib. STOW_EIO when
 * the file cannot be read. *out is untouched on error.
 * Ownership: the caller frees *out with stow_trace_free.
 * Thread safety: reentrant.
 * Errors: STOW_EINVAL, STOW_EIO, STOW_EPARSE, STOW_EHOSTMEM.
 */
STOW_API stow_status_t stow_trace_load(const char *path, stow_trace_t **out, char *err,
                                       size_t err_len);

/* Same as stow_trace_load, from a memory buffer (plain or gzip-compressed);
 * `name` is used in messages. */
STOW_API stow_status_t stow_trace_parse(const char *name, const char *text, size_t text_len,
                                        stow_trace_t **out, char *err, size_t err_len);

/* DESTRUCTOR. NULL is a harmless no-op. */
STOW_API void stow_trace_free(stow_trace_t *trace);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_TRACE_H */
