/*
 * replay/pytorch_model.h: a replay model of PyTorch's native CUDACachingAllocator
 * (c10/cuda/CUDACachingAllocator.cpp) and of its expandable_segments mode.
 *
 * The model runs on a simulated device: no GPU, no CUDA. It keeps the allocator's
 * host-side state (free-block sets, segments, split blocks, expandable segments)
 * and its own counter of reserved device bytes, checked against capacity_bytes the
 * way cudaMalloc / cuMemCreate would fail on a full device. Addresses are fake
 * integers; nothing is ever dereferenced. It is used by
 * `stowage replay --policy pytorch|pytorch-expandable`, by benchmarks and by tests
 * to answer "what would PyTorch have reserved on this trace?".
 *
 * What is modelled (docs/pytorch_model.md has the full list and the error table):
 *   - round_size: 512 B multiples, optional roundup_power2_divisions (16 intervals,
 *     1 MiB .. 64 GiB, clamped);
 *   - two pools: small (rounded size <= 1 MiB) and large;
 *   - get_allocation_size: 2 MiB segments for small requests, 20 MiB for
 *     1 MiB < size < 10 MiB, else rounded up to 2 MiB;
 *   - best fit in a set ordered by (stream, size, address); blocks are reused only
 *     on their own stream; max_split_size and max_non_split_rounding rules;
 *   - should_split: small pool or expandable mode -> remainder >= 512 B; large pool
 *     -> size < max_split_size and remainder > 1 MiB;
 *   - coalescing with the previous/next block of the same segment on free;
 *   - the OOM path: garbage_collection_threshold (only with memory_fraction), then
 *     device alloc, then release_available_cached_blocks + retry, then
 *     release_cached_blocks + retry (counted in num_alloc_retries), then ENOMEM
 *     (counted in num_ooms);
 *   - expandable segments: one growing VA range per (stream, pool) reserving
 *     1 1/8 x device memory, mapped in 2 MiB (small) / 20 MiB (large) pages at the
 *     lowest free address, best fit that counts the unmapped tail as free space,
 *     unmapping of whole free pages on release.
 * Not modelled: record_stream / cross-stream events (frees complete at once),
 * CUDA-graph private pools, free-memory callbacks, IPC, history and snapshots.
 *
 * Thread safety: none. A model instance must be used by one thread at a time (the
 * replay driver is single-threaded); distinct instances are independent.
 * Cost: alloc and free are O(log n) in the number of free blocks of the pool
 * (treaps); stats with largest-free-block is O(n); empty_cache is O(n log n).
 */
#ifndef STOWAGE_MODELS_PYTORCH_MODEL_H
#define STOWAGE_MODELS_PYTORCH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "stowage/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch's constants (c10/cuda/CUDACachingAllocator.cpp). */
#define STOW_PTM_MIN_BLOCK_BYTES ((size_t)512)          /* kMinBlockSize */
#define STOW_PTM_SMALL_SIZE_BYTES ((size_t)1048576)     /* kSmallSize: small pool limit */
#define STOW_PTM_SMALL_BUFFER_BYTES ((size_t)2097152)   /* kSmallBuffer: small segment */
#define STOW_PTM_MIN_LARGE_ALLOC_BYTES ((size_t)10485760) /* kMinLargeAlloc */
#define STOW_PTM_LARGE_BUFFER_BYTES ((size_t)20971520)  /* kLargeBuffer: 20 MiB */
#define STOW_PTM_ROUND_LARGE_BYTES ((size_t)2097152)    /* kRoundLarge */
#define STOW_PTM_ROUNDUP_INTERVALS 16 /* roundup_power2_divisions: 1 MiB .. 64 GiB */
/* totalGlobalMem of the H200 the traces were recorded on (143771 MiB); the device
 * size used when capacity_bytes is 0 (for memory_fraction and expandable VA). */
#define STOW_PTM_H200_TOTAL_BYTES ((size_t)150754820096ULL)

/* The driver calls PyTorch's allocator makes, one report each to the optional
 * observer stow_ptm_config_t.on_driver_call, with the bytes the call covers. */
typedef enum stow_ptm_driver_call {
    STOW_PTM_CUDA_MALLOC,        /* cudaMalloc of a native segment */
    STOW_PTM_CUDA_FREE,          /* cudaFree of one */
    STOW_PTM_ADDRESS_RESERVE,    /* cuMemAddressReserve of an expandable segment's range */
    STOW_PTM_ADDRESS_FREE,       /* cuMemAddressFree of it */
    STOW_PTM_MEM_CREATE,         /* cuMemCreate of one page */
    STOW_PTM_MEM_MAP,            /* cuMemMap of one page, with its share of cuMemSetAccess */
    STOW_PTM_MEM_UNMAP,          /* cuMemUnmap of one page */
    STOW_PTM_MEM_RELEASE,        /* cuMemRelease of one page */
    STOW_PTM_STREAM_SYNCHRONIZE, /* before unmapping a block's pages (size 0) */
} stow_ptm_driver_call_t;

typedef struct stow_ptm_config {
    size_t capacity_bytes;        /* simulated device memory; 0 = unlimited (in effect
                                     just under 2^62 bytes reserved over the model's life:
                                     its fake addresses are not reused) */
    int expandable;               /* nonzero: expandable_segments:True */
    size_t max_split_size_bytes;  /* SIZE_MAX = unlimited (default); else >= 20 MiB */
    size_t max_non_split_rounding_bytes; /* default 20 MiB (kLargeBuffer) */
    /* Per-interval divisions for sizes in [2^(20+i), 2^(21+i)); interval 0 also
     * covers sizes under 1 MiB, the last one sizes over 64 GiB. 0 or 1 = off;
     * otherwise a power of two. Setting all 16 to N is "roundup_power2_divisions:N". */
    unsigned roundup_power2_divisions[STOW_PTM_ROUNDUP_INTERVALS];
    double garbage_collection_threshold; /* in (0,1); 0 = off; needs memory_fraction */
    double memory_fraction;      /* set_per_process_memory_fraction; 0 = not set */
    size_t large_segment_bytes;  /* large_segment_size_mb; default 20 MiB */
    /* NULL (default), or called with on_driver_call_arg for each driver call, in order */
    void (*on_driver_call)(void *arg, stow_ptm_driver_call_t call, size_t size_bytes);
    void *on_driver_call_arg;
} stow_ptm_config_t;

/* Counters, named after PyTorch's DeviceStats (all pools together). */
typedef struct stow_ptm_stats {
    size_t reserved_bytes_current;  /* cudaMalloc'ed + mapped bytes */
    size_t reserved_bytes_peak;     /* torch.cuda.max_memory_reserved() */
    size_t allocated_bytes_current; /* rounded sizes of live blocks */
    size_t allocated_bytes_peak;
    size_t requested_bytes_current; /* sizes as requested */
    size_t requested_bytes_peak;
    size_t segment_count_current;   /* cudaMalloc segments + expandable segments */
    size_t segment_count_peak;
    size_t allocation_count_current;
    size_t inactive_split_bytes;    /* free bytes in split non-expandable segments */
    size_t largest_free_block_bytes; /* largest cached (mapped) free block */
    uint64_t device_alloc_calls;    /* num_device_alloc: cudaMalloc + map_block calls */
    uint64_t device_free_calls;     /* num_device_free: cudaFree + unmap_block calls */
    uint64_t map_calls;             /* map_block calls (expandable) */
    uint64_t unmap_calls;           /* unmap_block calls that unmapped something */
    uint64_t pages_created;         /* cuMemCreate calls (pages mapped) */
    uint64_t pages_released;        /* cuMemRelease calls (pages unmapped) */
    uint64_t num_alloc_retries;     /* alloc_block(isRetry=true) calls */
    uint64_t num_ooms;              /* allocations that returned STOW_ENOMEM */
    uint64_t num_sync_all_streams;  /* release_cached_blocks calls */
    uint64_t num_gc_runs;           /* garbage_collect_cached_blocks calls that freed */
} stow_ptm_stats_t;

typedef struct stow_ptm stow_ptm_t; /* opaque */

/* Writes PyTorch's defaults (native mode, unlimited device, no knobs) into *config.
 * Thread safety: pure. */
void stow__ptm_config_default(stow_ptm_config_t *config);

/*
 * Creates a model. config may be NULL (defaults).
 * Ownership: the caller destroys *out with stow__ptm_destroy; config is copied.
 * Thread safety: reentrant.
 * Errors: STOW_EINVAL (max_split_size under 20 MiB, divisions not a power of two,
 * thresholds out of range, out NULL), STOW_EHOSTMEM.
 */
stow_status_t stow__ptm_create(const stow_ptm_config_t *config, stow_ptm_t **out);

/*
 * DeviceCachingAllocator::malloc of size_bytes on stream. On success *handle_out
 * names the block until stow__ptm_free. size 0 is allowed and gets a 512 B block
 * (the replay counts it; PyTorch itself skips size 0 above the allocator).
 * Ownership: the handle is owned by the model.
 * Thread safety: none (see top).
 * Errors: STOW_EINVAL (model or handle_out NULL), STOW_ENOMEM (the full
 * release-and-retry path failed; num_ooms counts it; state stays consistent),
 * STOW_EHOSTMEM (metadata), STOW_EOVERFLOW (size near SIZE_MAX).
 */
stow_status_t stow__ptm_alloc(stow_ptm_t *model, size_t size_bytes, uint32_t stream,
                              uint64_t *handle_out);

/*
 * Frees a block: it goes back to its pool at once and merges with free neighbours
 * (free_completed). Device memory is not returned (caching).
 * Thread safety: none. Errors: STOW_EINVAL (model NULL), STOW_ENOTOWNED (handle
 * unknown or already freed).
 */
stow_status_t stow__ptm_free(stow_ptm_t *model, uint64_t handle);

/* torch.cuda.empty_cache(): release_cached_blocks (cudaFree of unsplit segments,
 * unmap of whole free pages of expandable segments). NULL: no-op. */
void stow__ptm_empty_cache(stow_ptm_t *model);

/* torch.cuda.reset_peak_memory_stats(): every peak becomes its current value. */
void stow__ptm_reset_peak(stow_ptm_t *model);

/* Fills *out. O(n) in the number of free blocks (largest_free_block_bytes). */
void stow__ptm_stats(const stow_ptm_t *model, stow_ptm_stats_t *out);

/* The rounded block size PyTorch would use for a request (round_size). */
size_t stow__ptm_round_size(const stow_ptm_t *model, size_t size_bytes);

/* Size of the block behind a live handle, or 0 when the handle is not live. */
size_t stow__ptm_block_size(const stow_ptm_t *model, uint64_t handle);

/* Fake device address of a live handle, or 0 when the handle is not live. */
uint64_t stow__ptm_block_address(const stow_ptm_t *model, uint64_t handle);

/*
 * Checks every internal invariant (tree order, neighbour links, byte sums against
 * the counters). Returns STOW_OK or STOW_EINVAL. O(n log n); for tests.
 */
stow_status_t stow__ptm_check(const stow_ptm_t *model);

/* DESTRUCTOR. Frees all host metadata (live handles die with it). NULL: no-op. */
void stow__ptm_destroy(stow_ptm_t *model);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_MODELS_PYTORCH_MODEL_H */
