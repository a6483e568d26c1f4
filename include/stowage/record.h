/*
 * stowage/record.h: recording a live pool's events, and allocation tags.
 *
 * A pool can record what happens to it (allocations, frees, segment
 * reservations and releases, page maps and unmaps, out-of-memory errors, the
 * step markers of stow_pool_step) into a bounded ring buffer: off by default,
 * on with stow_record_start() or "record_events:N" in STOWAGE_CONF. stow_trace_dump() writes the buffer as a
 * .rep trace (docs/trace_format.md) that `build/stowage replay`, `report` and
 * `diff` read, plus TRACE.tags ("<id> <tag>" per line) when tags were set.
 *
 * Tags name what an allocation is for ("weights", "activations", "optimizer",
 * "kv_cache"...): a thread-local current tag is attached to every allocation
 * the thread makes, and the pool keeps allocated bytes per tag. Set one around
 * a region of code (stow_tag_set before, the previous stow_tag_current after):
 * every allocation recorded in it carries the tag into TRACE.tags, and
 * `stowage report` shows it in its sources of the peak.
 *
 * Sites name where an allocation was made ("train.py:42 forward"): many and
 * long where tags are few and short, kept with recorded allocations only (no
 * accounting). A recorded allocation with a site has its site in TRACE.tags,
 * else its tag. stowage.record() (Python) sets the user's own line as the
 * site of each allocation PyTorch makes through Stowage (docs/report.md).
 */
#ifndef STOWAGE_RECORD_H
#define STOWAGE_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "stowage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STOW_TAG_MAX 64       /* distinct tags in a process (tag 0 is "untagged") */
#define STOW_TAG_NAME_MAX 32  /* bytes, NUL included */

/*
 * Sets the calling thread's current tag (NULL or "" = untagged) and returns its
 * id through *id_out (optional). Names are interned process-wide; at most
 * STOW_TAG_MAX - 1 distinct names (then STOW_EBUSY); a name of
 * STOW_TAG_NAME_MAX bytes or more, with a line break or starting with a blank
 * is STOW_EINVAL (TRACE.tags holds it as written, one a line: docs/report.md).
 * Thread safety: safe; the current tag is per thread.
 */
STOW_API stow_status_t stow_tag_set(const char *name, unsigned *id_out);

/* The calling thread's current tag name ("" when untagged); static storage. */
STOW_API const char *stow_tag_current(void);

/* Name of tag `id` ("" for 0 or unknown); static storage, never freed. */
STOW_API const char *stow_tag_name(unsigned id);

/* ---- sites ---- */

#define STOW_RECORD_SITES_MAX (1u << 20) /* distinct sites in a process (site 0 is "none") */
#define STOW_RECORD_SITE_TEXT_MAX 1024   /* bytes, NUL included */

/*
 * Interns `text` process-wide and returns its id (at least 1; the same text
 * always gives the same id) through *id_out.
 * Ownership: the text is copied; the copy lives until the process exits.
 * Thread safety: safe (one lock for all sites; callers cache ids).
 * Errors: STOW_EINVAL (NULL text or id_out, "", STOW_RECORD_SITE_TEXT_MAX bytes
 * or more, a line break, a leading blank: TRACE.tags holds one a line),
 * STOW_EBUSY (STOW_RECORD_SITES_MAX - 1 texts interned already), STOW_EHOSTMEM;
 * *id_out is untouched on error.
 */
STOW_API stow_status_t stow_record_site_intern(const char *text, uint32_t *id_out);

/*
 * Sets the calling thread's current site (0: none): every allocation the
 * thread makes from a recording pool is recorded with it.
 * Thread safety: safe; the current site is per thread.
 * Errors: STOW_EINVAL (an id stow_record_site_intern never returned).
 */
STOW_API stow_status_t stow_record_site_set(uint32_t id);

/* The calling thread's current site (0: none). Thread safety: per thread. */
STOW_API uint32_t stow_record_site_current(void);

/* The text of site `id` ("" for 0 or an unknown id). Ownership: static
 * storage until the process exits; never free it. Thread safety: safe. */
STOW_API const char *stow_record_site_text(uint32_t id);

/* Allocated bytes of one tag in a pool. */
typedef struct stow_tag_stats {
    uint64_t allocated_bytes;      /* current */
    uint64_t allocated_bytes_peak; /* since creation or the last stow_stats_reset_peak */
    uint64_t allocations;          /* current count */
} stow_tag_stats_t;

/* Per-tag figures of `pool`: out[0..STOW_TAG_MAX). Errors: STOW_EINVAL. */
STOW_API stow_status_t stow_pool_tag_stats(stow_pool_t *pool, stow_tag_stats_t out[STOW_TAG_MAX]);

/*
 * Starts recording into a ring buffer of `capacity_events` events (the oldest
 * are overwritten), replacing any previous buffer; 0 stops recording and frees
 * it. 32 bytes per event, at most STOW_RECORD_EVENTS_MAX events (stowage.h);
 * the buffer starts at 4,096 events and doubles as they come, up to capacity
 * (a recording that cannot grow for lack of host memory wraps at the size it
 * reached).
 * Errors: STOW_EINVAL (also above the maximum), STOW_EHOSTMEM.
 * Thread safety: safe.
 */
STOW_API stow_status_t stow_record_start(stow_pool_t *pool, size_t capacity_events);

/* Events recorded since the start (including overwritten ones), and kept. */
STOW_API void stow_record_counts(stow_pool_t *pool, uint64_t *recorded, uint64_t *kept);

/*
 * Writes the recorded events as a .rep trace to `path` (and `path`.tags when any
 * allocation has a site or a tag: "<id> <site>", else "<id> <tag>").
 * Allocations whose allocation event was overwritten are left out, with their
 * frees; step markers are 'm KEY' and 'e' lines;
 * the other events of the kind the format has no line for (segments, maps,
 * OOMs) are written as '#' comment lines, which readers ignore. The buffer is
 * kept. Errors: STOW_EINVAL (not recording), STOW_EIO, STOW_EHOSTMEM.
 * Thread safety: safe (the pool is locked while the buffer is copied).
 */
STOW_API stow_status_t stow_trace_dump(stow_pool_t *pool, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_RECORD_H */
