/*
 * stowage/tuning.h: the pool's measured constants, settable to measure them
 * again.
 *
 * These are not settings. STOWAGE_CONF, stow_config_parse and the PyTorch
 * entry points never read them, and a pool made by stow_pool_create has the
 * defaults below. Each default is a constant that docs/decisions.md measured,
 * under the heading named beside its field, with the command that measures
 * it. The benchmarks (`stowage replay --tuning KEY:VALUE,...`) and the tests
 * set them to compare a constant with its alternatives; a program that sets
 * them runs a pool nobody measured.
 *
 * Thread safety: stow_tuning_default and stow_tuning_parse are reentrant;
 * stow_pool_create_tuned is as stow_pool_create.
 */
#ifndef STOWAGE_TUNING_H
#define STOWAGE_TUNING_H

#include <stdbool.h>
#include <stddef.h>

#include "stowage/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define STOW_NODISCARD __attribute__((warn_unused_result))
#else
#define STOW_NODISCARD
#endif

struct stow_config;
struct stow_backend;
struct stow_pool;

typedef struct stow_tuning {
    /* Classic pool. */
    unsigned quick_depth;        /* 64 ("Quick lists"): freed blocks of at most 64 KiB kept
                                    whole per size and stream; 0 = off, at most
                                    STOW_QUICK_DEPTH_MAX (a page-mapped pool caps it at
                                    STOW_VMM_QUICK_DEPTH_MAX) */
    unsigned quick_mid_slots;    /* 8 ("Quick lists"): freed small blocks over 64 KiB kept whole
                                    per stream; 0 = off, at most STOW_QUICK_MID_SLOTS_MAX */
    double keep_idle_max;        /* 0.05 ("keep_idle_max 0.05"): once growth keeps releasing
                                    idle segments, keep them while reserved stays within 1 +
                                    this of the allocated peak; 0: always release */
    bool reuse_other_streams_on_miss; /* false ("reuse_other_streams_on_miss false"): other
                                    streams' completed frees are taken before the pool grows,
                                    not only when memory is short */
    /* Page-mapped pool. */
    double vmm_slack;            /* 0.0095 ("vmm_slack 0.0095"): physical memory held beyond
                                    the live bytes' high-water mark, as a fraction of it,
                                    before the pool remaps unused granules */
    double vmm_slack_max;        /* 0.05 ("vmm_slack_max 0.05"): the most a pool that keeps
                                    remapping raises its slack to; at or below vmm_slack:
                                    never raised */
    unsigned vmm_small_kb;       /* 128 ("vmm_small_kb 128"), at most 1024: requests of at most
                                    this many KiB get a range of their own per stream */
    unsigned vmm_handle_mb;      /* 20 ("vmm_handle_mb 20"), at most STOW_VMM_HANDLE_MB_MAX:
                                    the largest physical handle */
    bool vmm_learn_step;         /* true ("vmm_learn_step true"): a pool that remaps learns its
                                    loop's step and gives its large blocks planned addresses */
    /* Planned steps. */
    unsigned planned_warmup_steps; /* 1 ("Planned steps"), at most STOW_PLANNED_WARMUP_MAX: a
                                    key's first steps not recorded */
    double planned_headroom;     /* 0 ("Planned steps"), in [0, 1]: the arena is the largest
                                    plan x (1 + this) */
    bool planned_auto;           /* false ("planned_steps and planned_auto false"): without
                                    markers the pool finds its loop's step (the period of its
                                    requests) and plans it as a key; a marker ends it */
} stow_tuning_t;

/* Bounds of the fields above. */
#define STOW_QUICK_DEPTH_MAX 255u
#define STOW_QUICK_DEPTH_DEFAULT 64u
#define STOW_VMM_QUICK_DEPTH_MAX 16u /* a kept block holds its granules (docs/decisions.md) */
#define STOW_QUICK_MID_SLOTS_MAX 8u  /* and the default: at most 8 MiB kept per stream */
#define STOW_VMM_HANDLE_MB_DEFAULT 20u
#define STOW_VMM_HANDLE_MB_MAX 65536u
#define STOW_VMM_SMALL_KB_DEFAULT 128u
#define STOW_PLANNED_WARMUP_MAX 1000u

/* The measured constants. */
STOW_API void stow_tuning_default(stow_tuning_t *tuning);

/*
 * Applies `text` ("key:value,key:value", the names of the fields above) on
 * top of *tuning. When config is not NULL, the keys of stow_config_parse go
 * to it in the same text (one string for a test's pool), and so does
 * release_idle_on_grow (stow_config_t's field of the C API). A bad key or value
 * returns STOW_EINVAL with "key 'K': reason" in err and changes neither.
 * Errors: STOW_EINVAL, STOW_EHOSTMEM.
 */
STOW_API stow_status_t stow_tuning_parse(struct stow_config *config, stow_tuning_t *tuning,
                                         const char *text, char *err, size_t err_len);

/* The name of the index-th constant that stow_tuning_parse takes (the fields
 * above and release_idle_on_grow), in a fixed order; NULL past the last.
 * The string is static: never freed by the caller. */
STOW_API const char *stow_tuning_key_name(size_t index);

/* stow_pool_create with these constants (NULL: the defaults). Errors: as
 * stow_pool_create, and STOW_EINVAL for a tuning out of its bounds. */
STOW_API STOW_NODISCARD stow_status_t stow_pool_create_tuned(const struct stow_config *config,
                                                             const stow_tuning_t *tuning,
                                                             const struct stow_backend *backend,
                                                             struct stow_pool **out);

#ifdef __cplusplus
}
#endif

#endif
