/*
 * replay/replay_engine.h: the replay engine behind `stowage replay`: a table of
 * allocation policies behind one small vtable, a driver that replays a trace
 * through one of them (measured pass, warm timed passes), the minimum-capacity
 * search, the command-line options and the text/JSON printers.
 *
 * It lives in replay/ (static library stowage_models) so that the unit tests
 * link it; cli/cmd_replay.c is only the glue between argv and these calls.
 *
 * Policies (stow__replay_policies, in `--policy all` order):
 *   classic             the Stowage pool (allocator/) on the simulated device
 *   vmm                 the same pool with page-mapped segments
 *   pytorch             replay/pytorch_model.h, native mode
 *   pytorch-expandable  the same model, expandable_segments:True
 *   naive               one backend reservation per request (replay/naive.c)
 *   jemalloc            jemalloc on the host, private arena (replay/jemalloc_policy.c)
 *   jemalloc-decay      the same with jemalloc's default decay (by name only)
 *   jemalloc-tcache     the same as jemalloc with a thread cache (by name only)
 *   ideal-remap         reference: best-fit addresses, physical pages exactly
 *                       under live data (replay/ideal_remap.c; by name only)
 * To add one: define a stow_replay_policy_t and list it in replay_engine.c.
 *
 * Thread safety: none. Every call here is single-threaded (one replay at a time
 * per policy instance); distinct instances are independent, except that
 * jemalloc instances share the process's jemalloc.
 */
#ifndef STOWAGE_MODELS_REPLAY_ENGINE_H
#define STOWAGE_MODELS_REPLAY_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "stowage.h"
#include "stowage/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Step of the minimum-capacity search and unit of every simulated device
 * (cudaMalloc and cuMemCreate granularity): the answer is a multiple of it. */
#define STOW_REPLAY_CAPACITY_STEP_BYTES ((size_t)2097152)

/* What a policy instance is created with. */
typedef struct stow_replay_setup {
    const stow_config_t *config; /* --conf / STOWAGE_CONF settings; never NULL */
    size_t capacity_bytes;       /* simulated device memory; 0 = unlimited */
} stow_replay_setup_t;

/* What a policy reports after its measured pass. */
typedef struct stow_replay_report {
    uint64_t peak_reserved_bytes;  /* high-water mark of reserved bytes */
    uint64_t backend_calls;        /* every call to the device: reserve/release, and for
                                      vmm also map/unmap, granule creates and events */
    bool has_backend_calls;        /* false: not defined for this policy (host) */
    double fragmentation_at_peak;  /* < 0: not tracked */
    stow_stats_t *stats;           /* classic and vmm: full snapshot, else NULL */
    bool has_map_calls;            /* page mapping counted (vmm, pytorch-expandable, ...) */
    uint64_t map_calls, unmap_calls;
    bool has_modelled_time;        /* the simulated device's cost model applies */
    uint64_t modelled_backend_ns;  /* sum of modelled backend call costs, measured pass */
} stow_replay_report_t;

/*
 * One allocation policy. Handles are opaque to the engine; a FREE passes back
 * the handle its ALLOC produced together with the requested size.
 */
typedef struct stow_replay_policy {
    const char *name;    /* --policy value */
    const char *summary; /* one line for --help */
    bool device;         /* runs on the simulated device: --capacity and
                            --min-capacity apply; false: host memory (jemalloc) */
    /* Errors: STOW_EINVAL (setting the policy rejects), STOW_EHOSTMEM... */
    stow_status_t (*create)(const stow_replay_setup_t *setup, void **out);
    /* STOW_OK, or STOW_ENOMEM after the policy's own release-and-retry path. */
    stow_status_t (*alloc)(void *ctx, uint64_t size_bytes, uint32_t stream, uint64_t *handle);
    /* pre: handle came from alloc, not yet freed. */
    void (*free)(void *ctx, uint64_t handle, uint64_t size_bytes);
    /* Optional, measured pass only (never in timed passes): called after each
     * successful alloc (is_alloc true) and before each free, so that a policy
     * can sample statistics that are too slow to read per event.
     * NULL: nothing to sample. */
    void (*sample)(void *ctx, uint64_t handle, uint64_t size_bytes, bool is_alloc);
    /* Fills *out after the measured pass (out is zeroed by the engine). */
    void (*report)(void *ctx, stow_replay_report_t *out);
    /* DESTRUCTOR; live handles die with the instance. */
    void (*destroy)(void *ctx);
    /* Chosen by name only: `--policy all` leaves it out (a variant of a
     * reference that the side-by-side table already has, or a reference
     * that is no allocator: ideal-remap). */
    bool not_in_all;
    /* Optional: a step marker of the trace ('m KEY', or 'e' with key NULL),
     * before the event it precedes, in every pass. NULL: markers are
     * ignored (every model but Stowage's own pools). */
    void (*step)(void *ctx, const char *key);
    /* `--policy all` runs it only on a trace with step markers (a planned
     * pool plans nothing without them). */
    bool markers_only;
} stow_replay_policy_t;

extern const stow_replay_policy_t stow__replay_policy_classic;    /* replay_policies.c */
extern const stow_replay_policy_t stow__replay_policy_vmm;        /* replay_policies.c */
extern const stow_replay_policy_t stow__replay_policy_classic_planned; /* replay_policies.c */
extern const stow_replay_policy_t stow__replay_policy_vmm_planned; /* replay_policies.c */
extern const stow_replay_policy_t stow__replay_policy_pytorch;    /* replay_policies.c */
extern const stow_replay_policy_t stow__replay_policy_pytorch_expandable;
/* The PyTorch model behind an instance of either pytorch policy (for tests). */
struct stow_ptm;
struct stow_ptm *stow__replay_ptm_model(void *ctx); /* replay_policies.c */
extern const stow_replay_policy_t stow__replay_policy_naive;      /* naive.c */
extern const stow_replay_policy_t stow__replay_policy_jemalloc;   /* jemalloc_policy.c */
extern const stow_replay_policy_t stow__replay_policy_jemalloc_decay; /* jemalloc_policy.c */
extern const stow_replay_policy_t stow__replay_policy_jemalloc_tcache; /* jemalloc_policy.c */
extern const stow_replay_policy_t stow__replay_policy_ideal_remap; /* ideal_remap.c */

/* The policy table, in `--policy all` order (which skips those marked
 * not_in_all); NULL-terminated. */
extern const stow_replay_policy_t *const stow__replay_policies[];

/* The policy called `name`, or NULL. */
const stow_replay_policy_t *stow__replay_policy_find(const char *name);

/* ---------------------------------------------------------------------- */
/* Options of `stowage replay` */

#define STOW_REPLAY_MAX_POLICIES 16

typedef struct stow_replay_opts {
    const stow_replay_policy_t *policies[STOW_REPLAY_MAX_POLICIES]; /* to run, in order */
    unsigned policy_count;
    bool all;              /* --policy all: print the side-by-side table */
    size_t capacity_bytes; /* --capacity; 0 = unlimited */
    unsigned repeats;      /* --repeats: warm timed passes, default 5 */
    bool min_capacity;     /* --min-capacity */
    bool json;             /* --json */
    bool summary;          /* --summary (classic) */
    bool help;             /* --help / -h given: print usage, exit 0 */
    const char *conf;      /* --conf, applied after STOWAGE_CONF */
    const char *tuning;    /* --tuning: measured constants (stowage/tuning.h), or NULL */
    int first_trace;       /* argv index of the first trace */
    bool policy_given;     /* --policy named the policies; false: classic, until the
                              settings pick another (stow__replay_conf_resolve) */
    bool allow_oom;        /* --allow-oom: out-of-memory errors do not fail the replay */
} stow_replay_opts_t;

/*
 * Parses argv (argv[0] is "replay"). On success *out holds the options; traces
 * are argv[out->first_trace .. argc). --help sets out->help and stops parsing.
 * Errors: STOW_EINVAL with a one-line message in err (unknown option or
 * policy, missing value, an option given twice, bad byte count, repeats out of
 * 0..1000, --min-capacity with --capacity, --summary with --json or --policy
 * all, no trace). *out is unspecified on error.
 */
stow_status_t stow__replay_opts_parse(int argc, char **argv, stow_replay_opts_t *out, char *err,
                                      size_t err_len);

/* "123", "4K", "16MiB", "2G", "1T" (powers of 1024) -> bytes. False on junk or overflow. */
bool stow__replay_parse_bytes(const char *text, size_t *out);

/* The measured constants (stowage/tuning.h) every pool replayed after the call
 * is created with (NULL: the defaults), and those in force. Not thread-safe:
 * set once, before replaying (the command line's --tuning). */
void stow__replay_set_tuning(const stow_tuning_t *tuning);
const stow_tuning_t *stow__replay_tuning(void);

/* The built-in defaults, then STOWAGE_CONF, then `conf` (--conf; may be NULL).
 * Errors: STOW_EINVAL with the offending key in err. */
stow_status_t stow__replay_load_config(const char *conf, stow_config_t *out, char *err,
                                       size_t err_len);

/*
 * Checks the settings of STOWAGE_CONF and `conf` (--conf; may be NULL), merged
 * into *config by stow__replay_load_config, against the policies a command
 * replays, so that no setting is dropped unseen:
 *   - without --policy (policy_given false; *count is 1), the settings pick the
 *     policy: policy:vmm or expandable_segments:True a page-mapped pool,
 *     planned_steps:true a planned one (classic, vmm, classic-planned or
 *     vmm-planned; policies[0] is set to it);
 *   - a key that selects a pool (policy, expandable_segments, planned_steps,
 *     planned_async) and disagrees with a policy given is an error that names
 *     the key and the policy to use instead;
 *   - a key that none of the policies applies (a Stowage pool key for the
 *     PyTorch models, a vmm key for classic, any key for naive, jemalloc and
 *     ideal-remap) is an error that names the key and the policies that apply
 *     it; one that some of them apply gets a one-line note on `notes`
 *     ("WHO: note: ...") naming those that run without it.
 * Errors: STOW_EINVAL with the message in err; STOW_EHOSTMEM.
 */
stow_status_t stow__replay_conf_resolve(const char *conf, const stow_config_t *config,
                                        bool policy_given, const stow_replay_policy_t **policies,
                                        unsigned *count, FILE *notes, const char *who, char *err,
                                        size_t err_len);

/*
 * Parses `text` (--tuning: the constants of stowage/tuning.h and
 * release_idle_on_grow) into *out, over the defaults, against the policies a
 * command replays: a setting of stow_config_parse is an error saying to give
 * it in --conf, and a constant that none of the policies uses (a vmm constant
 * for classic, a classic one for vmm, a planned one without a planned pool or
 * planned_auto, any for the models) is an error naming the policies that use
 * it. release_idle_on_grow goes to config. Errors: STOW_EINVAL, message in err.
 */
stow_status_t stow__replay_tuning_resolve(const char *text,
                                          const stow_replay_policy_t *const *policies,
                                          unsigned count, stow_config_t *config,
                                          stow_tuning_t *out, char *err, size_t err_len);

/* The groups of policies (a bit mask, non-zero) that use the constant of
 * --tuning named by name[0..len) (stow_tuning_key_name); 0 for any other
 * name. */
unsigned stow__replay_tuning_groups(const char *name, size_t len);

/* The pool a planned policy (classic-planned, vmm-planned) runs on: classic or
 * vmm; NULL for any other policy. */
const stow_replay_policy_t *stow__replay_planned_base(const stow_replay_policy_t *policy);

/* When `policy` is a planned pool, `trace` has no step markers and the settings
 * do not find steps on their own (the constant planned_auto), writes one line to f,
 * "WHO: note: ...", saying that the policy plans nothing on this trace and that
 * its figures are its base pool's. Returns whether it wrote it. */
bool stow__replay_note_no_steps(FILE *f, const char *who, const stow_trace_t *trace,
                                const stow_replay_policy_t *policy, const stow_config_t *config);

/* The --help text. */
void stow__replay_usage(FILE *f);

/* ---------------------------------------------------------------------- */
/* Replays */

/* Progress for long runs: called between passes and probes (never per event). */
typedef void (*stow_replay_progress_fn)(void *arg, const char *trace, const char *policy,
                                        const char *stage);

typedef struct stow_replay_result {
    const char *policy;            /* policy name (static) */
    size_t events;
    uint64_t peak_live_bytes;      /* lower bound: from the trace */
    uint64_t peak_reserved_bytes;
    uint64_t backend_calls;
    bool has_backend_calls;
    double fragmentation_at_peak;  /* < 0: not tracked */
    uint64_t ooms;                 /* allocations that failed in the measured pass */
    double ns_per_event;           /* median of the warm timed passes; 0 if none */
    unsigned repeats;
    bool has_min_capacity;         /* searched and defined */
    uint64_t min_capacity_bytes;
    unsigned min_capacity_probes;  /* replays the search ran */
    bool has_map_calls;
    uint64_t map_calls, unmap_calls; /* measured pass */
    bool has_modelled_time;
    uint64_t modelled_backend_ns;  /* measured pass, simulated device's cost model */
    bool has_stats;
    stow_stats_t stats;            /* classic and vmm */
} stow_replay_result_t;

/*
 * Replays `trace` through `policy`: one measured pass on a device of
 * capacity_bytes (0 = unlimited), then `repeats` rounds of an untimed and a
 * timed pass on the same instance (live allocations freed before each pass;
 * stow__replay_time's rounds with one policy), and, if min_capacity
 * and the policy is a device policy, the minimum-capacity search.
 * A failed allocation counts in ooms; its free is skipped.
 * Errors: what policy->create returns; STOW_EHOSTMEM.
 */
stow_status_t stow__replay_run(const stow_replay_policy_t *policy, const stow_trace_t *trace,
                               const stow_config_t *config, size_t capacity_bytes,
                               unsigned repeats, bool min_capacity,
                               stow_replay_progress_fn progress, void *progress_arg,
                               stow_replay_result_t *out);

/*
 * Host time of `n` policies on one trace, timed side by side: a fresh instance
 * of each, then `repeats` rounds in which every policy in turn frees what is
 * live, replays the trace untimed (its caches warm again after the others'
 * passes) and replays it timed. ns_per_event[k] is the median of policies[k]'s
 * timed passes over trace->event_count (0 when repeats or events are 0).
 * The ratio of two policies' figures is what this is for: the passes it
 * compares run milliseconds apart, not one policy's seconds after another's.
 * Every instance is alive until the end (host policies hold host memory).
 * Errors: STOW_EINVAL, STOW_EHOSTMEM, what a policy's create returns (then no
 * figure is set).
 */
stow_status_t stow__replay_time(const stow_replay_policy_t *const *policies, unsigned n,
                                const stow_trace_t *trace, const stow_config_t *config,
                                size_t capacity_bytes, unsigned repeats,
                                stow_replay_progress_fn progress, void *progress_arg,
                                double *ns_per_event);

/*
 * Whether the whole trace runs on a device of capacity_bytes (> 0) with no
 * STOW_ENOMEM. One replay, stopped at the first OOM.
 * Errors: STOW_ENOSYS (host policy), what create returns.
 */
stow_status_t stow__replay_fits(const stow_replay_policy_t *policy, const stow_trace_t *trace,
                                const stow_config_t *config, size_t capacity_bytes, bool *fits);

/*
 * The smallest multiple of STOW_REPLAY_CAPACITY_STEP_BYTES at which the trace
 * fits, by binary search. peak_reserved_bytes is the policy's peak at unlimited
 * capacity: round_up(peak_reserved) fits (the run never notices the limit), and
 * round_up(peak_live) - step cannot fit, so the search starts on that bracket
 * (both ends are probed; the top end grows if it does not fit). The answer R is
 * exact for the step: R fits and R - step does not, both replayed.
 * Assumes fitting is monotone in capacity between the two (a caching policy may
 * in principle fit at C and fail at C + step; the search then returns one of
 * the boundaries).
 * Errors: STOW_ENOSYS (host policy), what create returns, STOW_ENOMEM (no fit
 * found below 2^46 bytes).
 */
stow_status_t stow__replay_min_capacity(const stow_replay_policy_t *policy,
                                        const stow_trace_t *trace, const stow_config_t *config,
                                        uint64_t peak_reserved_bytes, uint64_t *min_bytes,
                                        unsigned *probes);

/* One JSON object on one line: trace, policy, events, peak_live_bytes,
 * peak_reserved_bytes, reserved_over_live, backend_calls, ns_per_event, repeats,
 * ooms, min_capacity_bytes (null when not searched or not defined; with
 * min_capacity_probes when searched), map_calls, unmap_calls and, when known,
 * fragmentation_at_peak, modelled_backend_ms, waste_at_peak, num_alloc_retries,
 * sync_calls, event_records, event_waits. */
void stow__replay_print_json(FILE *f, const char *trace_path, const stow_replay_result_t *r);
/* Writes s as a JSON string literal (quotes, backslashes and control bytes
 * escaped; NULL as ""). Shared by every JSON the CLI prints. */
void stow__json_string(FILE *f, const char *s);

/* The single-policy text block (the `make demo` output). */
void stow__replay_print_text(FILE *f, const char *trace_path, const stow_replay_result_t *r,
                             bool min_capacity);

/* The side-by-side table: header once, then one row per (trace, policy). */
void stow__replay_print_table_header(FILE *f, bool min_capacity);
void stow__replay_print_table_row(FILE *f, const char *trace_path, const stow_replay_result_t *r,
                                  bool min_capacity);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_MODELS_REPLAY_ENGINE_H */
