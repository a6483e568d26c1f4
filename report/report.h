/*
 * report/report.h: the analyses behind `stowage report`, `stowage diff` and
 * `stowage import` (docs/report.md): a timeline of live and reserved bytes
 * replayed under a policy and downsampled so that peaks survive, the
 * allocations alive at the peak, allocation lifetimes aggregated for drawing,
 * iteration boundaries and leak detection, size-class comparison of two
 * traces, the self-contained HTML page, and the RMM log importer.
 *
 * Library-independent helpers: they read a stow_trace_t and drive the public
 * pool API or the replay engine; the unit tests link them (stowage_models).
 *
 * Thread safety: none needed; every function works on its own arguments.
 */
#ifndef STOWAGE_MODELS_REPORT_H
#define STOWAGE_MODELS_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "replay/replay_engine.h"
#include "stowage.h"
#include "stowage/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Downsampled series (report_series.c) */

/* One bucket of a series: events [first_event, first_event + event_count).
 * Invariant: lo <= hi; max over buckets of hi == max over events of the value. */
typedef struct stow_bucket {
    size_t first_event;
    size_t event_count;
    uint64_t lo; /* smallest value after an event of the bucket */
    uint64_t hi; /* largest value after an event of the bucket */
} stow_bucket_t;

/*
 * Splits values[0 .. n) into at most max_buckets buckets of consecutive events
 * (equal widths, the last one shorter) with the min and max of each, so that
 * a drawn series keeps every peak and trough. Returns the number of buckets
 * written to out (which holds max_buckets entries); 0 when n or max_buckets is 0.
 */
size_t stow__series_downsample(const uint64_t *values, size_t n, size_t max_buckets,
                               stow_bucket_t *out);

/* ---------------------------------------------------------------------- */
/* Timeline (report_data.c) */

/* Size class of a request for comparisons: [2^k, 2^(k+1)) bytes, k = class. */
#define STOW_REPORT_CLASSES 64
unsigned stow__report_size_class(uint64_t size_bytes);

typedef struct stow_report_alloc {
    uint32_t id;
    uint64_t size_bytes;
    size_t alloc_event; /* event index of the `a` line */
    size_t free_event;  /* event index of the `f` line; SIZE_MAX = never freed */
} stow_report_alloc_t;

/* Iteration boundaries and the live bytes there (leak detection). */
#define STOW_REPORT_MAX_BOUNDARIES 1024
typedef struct stow_growth {
    unsigned boundary_count;                       /* interior boundaries found or given */
    size_t boundary_event[STOW_REPORT_MAX_BOUNDARIES]; /* event index, ascending */
    uint64_t boundary_live[STOW_REPORT_MAX_BOUNDARIES]; /* live bytes after that event */
    const char *method;      /* "given", "iterations", "pattern" or "none" (static) */
    unsigned iterations;     /* boundary_count + 1 */
    bool leak;               /* steady growth: see stow__report_growth */
    int64_t growth_per_iteration_bytes; /* mean step between boundaries (from the 2nd) */
} stow_growth_t;

typedef struct stow_report {
    const stow_trace_t *trace;        /* borrowed */
    const char *policy;               /* policy name (static) */
    /* per event, after the event (arrays of trace->event_count) */
    uint64_t *live_bytes;             /* sum of live requested sizes */
    uint64_t *reserved_bytes;         /* the policy's reserved bytes; NULL: not observable */
    /* Stranded free memory (classic only; stow__report_build): samples after
     * events frag_event[0 .. frag_count), ascending, the last event included */
    size_t frag_count;
    size_t *frag_event;
    uint64_t *stranded_bytes;         /* stranded bytes after that event (below) */
    uint64_t *free_bytes;             /* free (cached) bytes in the pool's segments then */
    unsigned char *stranded_growth;   /* 1: the event raised reserved bytes to a new high */
    bool has_stranded;                /* false: not computed for this policy */
    uint64_t stranded_at_peak_bytes;  /* after peak_reserved_event */
    uint64_t free_at_peak_bytes;      /* free (cached) bytes then */
    uint64_t stranded_max_bytes;      /* the largest sample, and its event */
    size_t stranded_max_event;
    uint64_t stranded_growth_max_bytes; /* the largest sample at a new high, and its event */
    size_t stranded_growth_max_event;
    bool has_growth_sample;
    /* per allocation id, in id order */
    stow_report_alloc_t *allocs;
    size_t alloc_count;
    /* headline figures */
    uint64_t peak_live_bytes;
    size_t peak_live_event;
    uint64_t peak_reserved_bytes;
    size_t peak_reserved_event;       /* SIZE_MAX when reserved is not observable */
    uint64_t backend_calls;
    bool has_backend_calls;
    uint64_t ooms;
    bool has_min_capacity;
    uint64_t min_capacity_bytes;
    const char **tags;                /* borrowed, [id_count] or NULL; entries may be NULL */
} stow_report_t;

/*
 * Stranded bytes after event i, for a classic pool: the free bytes that
 * neither the request of event i nor any later one could be served from as
 * they lie. Free blocks are taken as maximal runs of adjacent free (cached)
 * blocks of one segment (stow_pool_snapshot), because the pool merges
 * neighbours before it grows. A run is stranded when
 *   - its segment also holds an allocated or pending block (a segment with
 *     none is idle: the pool gives it back before growing past its high), and
 *   - the trace requests at least one block of the run's pool kind at event i
 *     or later (small: at most 1 MiB; large: the rest), and every such request
 *     is larger than the run.
 * Event i's own request counts: at an event that made the pool grow, the runs
 * that request did not fit are ones the pool grew beside. Streams are not told
 * apart, and requests are compared by their size (with the default 512-byte
 * rounding, a request fits a run exactly when its size does): with several
 * streams or a coarser rounding the figure is a lower bound.
 *
 * Stranded bytes cost memory only where the pool grows beside them: at an
 * event that raises reserved bytes to a new high they are reserved bytes the
 * rest of the run cannot use, and at the reserved peak (stranded_at_peak_bytes)
 * they are the part of the peak lost to fragmentation. Where the pool does not
 * grow afterwards (near a trace's end, where few requests remain) they cost
 * nothing.
 */

/*
 * Builds the report of `trace` under `policy` on a device of capacity_bytes
 * (0 = unlimited): one replay that samples reserved bytes after every event
 * (classic, vmm, pytorch, pytorch-expandable; other policies give the headline
 * figures of stow__replay_run and no reserved series). For classic it also
 * computes stranded bytes (above) after about frag_samples evenly spaced
 * events (every event when the trace has fewer), the last event, and each
 * event that raises reserved bytes to a new high, so that
 * stranded_at_peak_bytes is exact; each costs one stow_pool_snapshot, linear
 * in the pool's blocks. min_capacity runs the search.
 * Errors: STOW_EINVAL (unknown policy), STOW_EHOSTMEM, what the policy returns.
 */
stow_status_t stow__report_build(const stow_trace_t *trace, const char *policy,
                                 const stow_config_t *config, size_t capacity_bytes,
                                 bool min_capacity, size_t frag_samples, stow_report_t *out);

/* Frees the arrays of a built report (not the trace or tags). */
void stow__report_free(stow_report_t *r);

/* The allocations alive after event `event`, largest first (ties: lower id);
 * writes at most max entries, returns how many are alive in all. */
size_t stow__report_alive_at(const stow_report_t *r, size_t event, stow_report_alloc_t *out,
                             size_t max);

/*
 * Leak detection over iteration boundaries. Boundaries come from `given`
 * (given_count event indices), else from `iterations` (> 1: the event of
 * lowest live bytes near each multiple of event_count / iterations), else are
 * detected: the period of the live-bytes curve (autocorrelation after removing
 * the linear trend), then the lowest point near each multiple of the period.
 * A leak is reported when, from the second boundary on (the first iteration
 * warms caches and optimizer state), at least two steps are all positive and
 * the total growth is at least 1% of the peak live bytes.
 */
void stow__report_growth(const stow_report_t *r, const size_t *given, unsigned given_count,
                         unsigned iterations, stow_growth_t *out);

/* Text form of the growth analysis (`stowage report --growth`). */
void stow__report_growth_print(FILE *f, const stow_report_t *r, const stow_growth_t *g);

/* Reads tags "<id> <tag text>" per line into an array of id_count strings
 * (NULL where none; a later line for the same id replaces the earlier). Blank
 * lines and lines starting with '#' are skipped; the id is decimal, below
 * id_count, and followed by blanks; the tag is the rest of the line (a final
 * '\r' dropped), of any length. Returns NULL and writes "FILE:LINE: reason"
 * into err on bad input (a NUL byte in a line included), "FILE: reason" when
 * the file cannot be read or host memory runs out. A gzip-compressed file is
 * read decompressed ("FILE:LINE: reason" too for a corrupt or truncated
 * stream). Free with
 * stow__report_tags_free. report/report_tags.c. */
const char **stow__report_tags_load(const char *path, uint32_t id_count, char *err,
                                    size_t err_len);
/* The same from memory; `name` is used in messages. */
const char **stow__report_tags_parse(const char *name, const char *text, size_t text_len,
                                     uint32_t id_count, char *err, size_t err_len);
void stow__report_tags_free(const char **tags, uint32_t id_count);

/* ---------------------------------------------------------------------- */
/* HTML page (report_html.c) */

typedef struct stow_html_opts {
    size_t max_points;   /* memory-chart buckets; 0 = 4000 */
    size_t max_bars;     /* lifetimes drawn one by one (largest first); 0 = 2000 */
    size_t peak_rows;    /* rows of the peak table; 0 = 100 */
} stow_html_opts_t;

/* Writes one self-contained HTML page (inline CSS, JS and data; no URL). */
stow_status_t stow__report_write_html(FILE *f, const stow_report_t *r, const stow_growth_t *g,
                                      const stow_html_opts_t *opts);

/* One JSON object on one line: the headline figures and the growth verdict. */
void stow__report_write_json(FILE *f, const stow_report_t *r, const stow_growth_t *g);

/* ---------------------------------------------------------------------- */
/* Diff (report_diff.c) */

typedef struct stow_diff_side {
    uint64_t peak_live_bytes;
    uint64_t peak_reserved_bytes;
    bool has_min_capacity;
    uint64_t min_capacity_bytes;
    uint64_t class_count[STOW_REPORT_CLASSES];   /* allocations per size class */
    uint64_t class_bytes[STOW_REPORT_CLASSES];   /* requested bytes per class, all allocations */
    uint64_t class_at_peak[STOW_REPORT_CLASSES]; /* live bytes per class at the live peak */
} stow_diff_side_t;

/* Figures of one trace for a diff: a replay under policy (repeats 0). */
stow_status_t stow__diff_side(const stow_trace_t *t, const stow_replay_policy_t *policy,
                              const stow_config_t *config, bool min_capacity,
                              stow_diff_side_t *out);

/* Relative growth of b over a in percent (a == 0: 0 if b == 0, else 100). */
double stow__diff_pct(uint64_t a, uint64_t b);

/* Prints the comparison; returns true when peak reserved or peak live grew by
 * more than threshold_pct (the regression verdict, exit status 1). */
bool stow__diff_print(FILE *f, const char *name_a, const char *name_b,
                      const stow_diff_side_t *a, const stow_diff_side_t *b, double threshold_pct,
                      const char *policy);

/* ---------------------------------------------------------------------- */
/* RMM logging_resource_adaptor CSV -> .rep (rmm_import.c) */

typedef struct stow_rmm_import_stats {
    uint64_t allocations;
    uint64_t frees;
    uint64_t failures;   /* "allocate failure" rows: not in the .rep format, counted */
    uint64_t zero_size;  /* allocations of 0 bytes: they hold no memory and the .rep format
                            has none, so they and their frees are counted and left out */
    uint32_t streams;
    uint64_t still_live; /* allocations never freed */
} stow_rmm_import_stats_t;

/*
 * Converts the CSV text (header Thread,Time,Action,Pointer,Size,Stream; actions
 * allocate, allocate failure, free) to .rep text written to out. Pointers map
 * to dense ids (a pointer freed and allocated again gets a new id), streams to
 * dense indices in order of first use. Allocations of 0 bytes (RMM logs them,
 * with a null pointer when the resource returns one) and their frees are left
 * out and counted. Errors: STOW_EPARSE with "NAME:LINE: reason" in err (bad
 * header, column count, action, pointer, size, a free of an unknown pointer or
 * with another size, an allocate of a live or null pointer with a size);
 * STOW_EHOSTMEM; STOW_EIO (write failed).
 */
stow_status_t stow__rmm_import(const char *name, const char *text, size_t text_len, FILE *out,
                               stow_rmm_import_stats_t *stats, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_MODELS_REPORT_H */
