/*
 * allocator/size_class.c: request size -> block size, and block size -> free
 * index bin.
 *
 * Block sizes are multiples of 512 B (CUDA allocations are 256-byte aligned;
 * 512 keeps the block count down at no measurable cost on the real traces and
 * matches PyTorch, so figures compare). With roundup_power2_divisions = d for
 * the request's interval, a request in [2^k, 2^(k+1)) is rounded up to the
 * next multiple of 2^k / d instead: fewer distinct sizes, better reuse for
 * workloads with varying shapes, at the price of rounding waste.
 */
#include "allocator/free_index.h"
#include "allocator/types.h"

static unsigned floor_log2(size_t x) { return 63u - (unsigned)__builtin_clzll((unsigned long long)x); }

static unsigned roundup_interval(size_t size_bytes)
{
    /* Interval i covers [2^(20+i), 2^(21+i)); below 1 MiB is interval 0. */
    unsigned lg = floor_log2(size_bytes);
    if (lg <= 20)
        return 0;
    unsigned i = lg - 20;
    return i < STOW_ROUNDUP_INTERVALS ? i : STOW_ROUNDUP_INTERVALS - 1;
}

/* Leave headroom for segment rounding (2 MiB granules at least): no size
 * within 1 GiB of SIZE_MAX is representable as a segment anyway. */
#define ROUND_LIMIT_BYTES (SIZE_MAX - ((size_t)1 << 30))

stow_status_t stow__round_size(const stow_config_t *config, size_t size_bytes, size_t *out)
{
    if (size_bytes > ROUND_LIMIT_BYTES)
        return STOW_EOVERFLOW;
    if (size_bytes <= STOW_MIN_BLOCK_BYTES) {
        *out = STOW_MIN_BLOCK_BYTES;
        return STOW_OK;
    }
    unsigned divisions = config->roundup_power2_divisions[roundup_interval(size_bytes)];
    if (divisions > 1 && size_bytes > STOW_MIN_BLOCK_BYTES * divisions) {
        size_t floor_pow2 = (size_t)1 << floor_log2(size_bytes);
        size_t step = floor_pow2 / divisions;
        if (size_bytes != floor_pow2) {
            /* floor + steps * step can reach 2^64 for sizes near the top of the
             * last interval: checked arithmetic, then the same limit as above. */
            size_t steps = (size_bytes - floor_pow2 + step - 1) / step, rounded;
            if (__builtin_mul_overflow(steps, step, &rounded) ||
                __builtin_add_overflow(rounded, floor_pow2, &rounded) ||
                rounded > ROUND_LIMIT_BYTES)
                return STOW_EOVERFLOW;
            *out = (rounded + STOW_MIN_BLOCK_BYTES - 1) & ~(STOW_MIN_BLOCK_BYTES - 1);
            return STOW_OK;
        }
    }
    *out = (size_bytes + STOW_MIN_BLOCK_BYTES - 1) & ~(STOW_MIN_BLOCK_BYTES - 1);
    return STOW_OK;
}
