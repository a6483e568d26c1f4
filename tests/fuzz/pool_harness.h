/*
 * tests/fuzz/pool_harness.h: what the pool fuzzers share (tests/fuzz/pool_harness.c).
 *
 * fuzz_api.c (random API sequences) and fuzz_step.c (repeated steps, for the
 * page-mapped pool's learned layout) drive one pool on one simulated device
 * through the same harness:
 * - a wrapper backend that counts injected faults and aborts if the pool ever
 *   misuses the device (EINVAL from the simulator);
 * - the device-work oracle: no block handed to a stream while another stream's
 *   queued work may use its bytes, no granule unmapped under a live block or
 *   queued work, no block handed out before a scrub covered it (scrub_on_free);
 * - the shadow model of the live (ptr, block, requested) set, compared with
 *   stow_pool_stats and stow_pool_check (fz_check_books; fuzz_api after every
 *   call);
 * - allocation and free with every check of the call's result;
 * - the blocks' contents: the device is host-backed (real memory, page
 *   mapping with the GPU's semantics), and each block gets a pattern of its
 *   own (all of a block of at most 4 KiB; of a larger one, 64 bytes at its
 *   ends and at both sides of each granule boundary inside it, at most 512
 *   boundaries), written as work queued on its stream after its allocation
 *   (after a check that it reads zero, with scrub_on_free) and checked by work
 *   queued before its free: a block that shares those bytes with another, loses
 *   a granule or keeps another block's data fails the check (or faults, on an
 *   unmapped granule) when the work runs.
 *
 * One input at a time, one thread: the state is global.
 */
#ifndef STOWAGE_TESTS_FUZZ_POOL_HARNESS_H
#define STOWAGE_TESTS_FUZZ_POOL_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stowage.h"
#include "stowage/sim.h"

#define FZ_MIB ((size_t)1 << 20)

#define FZ_MAX_LIVE 192
#define FZ_STREAMS 4

/* ---- input cursor: bytes past the end read as 0 ---- */
typedef struct fz_in {
    const uint8_t *p, *end;
} fz_in_t;

uint64_t fz_bytes(fz_in_t *in, unsigned n);
uint8_t fz_u8(fz_in_t *in);

/* ---- the device and the wrapper the pool sees ---- */
extern stow_backend_t *fz_sim;    /* the simulated device */
extern stow_backend_t fz_backend; /* what the pool sees */
extern size_t fz_capacity;        /* current device capacity (bytes) */
extern uint64_t fz_injected;      /* faults injected in this input */
extern uint64_t fz_handle_maps;   /* maps of a handle of several granules, over the process */
extern const stow_stream_t fz_streams[FZ_STREAMS];

/* Creates the simulated device and the wrapper around it, and resets the
 * oracle, from an input's setup byte as both pool fuzzers decode it: bits 0-1
 * the capacity (capacities[setup % 4]; 0: unlimited), bit 2 manual events,
 * bit 6 a backend without events (every stream shares one order), bit 7 the
 * pool scrubs freed blocks (scrub_on_free: the oracle checks scrubs). With
 * contents, the device is host-backed and the blocks' contents are checked
 * (above); without, its addresses are fake. */
void fz_device_open(uint8_t setup, const size_t capacities[4], bool contents);

/* Words of block contents written and checked, over the process. */
extern uint64_t fz_words_written, fz_words_checked;

/* ---- the device-work oracle ---- */
#define FZ_MAX_REGIONS 1024

typedef struct fz_region {
    uintptr_t lo, hi;
    uint64_t last_use[FZ_STREAMS]; /* 0: not a user */
    bool scrubbed;
} fz_region_t;

typedef struct fz_oracle {
    bool reuse_checks;  /* manual events, a backend with events: reuse must wait */
    bool unmap_checks;  /* manual events: an unmap must wait, whatever the backend */
    bool scrub_checks;  /* scrub_on_free */
    uint64_t clock;
    uint64_t done_upto[FZ_STREAMS];
    fz_region_t regions[FZ_MAX_REGIONS];
    unsigned n_regions;
    const struct fz_state *state; /* the shadow live set, for the unmap check */
    uintptr_t freeing;            /* the block a free call is freeing: live no more */
} fz_oracle_t;
extern fz_oracle_t fz_or;

unsigned fz_stream_index(stow_stream_t stream);
/* The work queued so far on the streams of mask is complete. */
void fz_streams_done(unsigned mask);
/* A block about to be freed; false when no room is left (it goes unchecked). */
bool fz_region_add(uintptr_t lo, uintptr_t hi, unsigned users);

/* ---- the shadow model ---- */
typedef struct fz_live {
    uintptr_t ptr;
    size_t block, req;
    unsigned users;  /* bit i: fz_streams[i] used it (its allocation, record_stream) */
    unsigned stream; /* the index of its allocation's stream */
    uint32_t tag;    /* its pattern's (tests/fuzz/pool_harness.c, contents) */
} fz_live_t;

typedef struct fz_state {
    stow_pool_t *pool;
    fz_live_t live[FZ_MAX_LIVE];
    unsigned n_live;
    uint64_t alloc_bytes, req_bytes;
    uintptr_t freed[16]; /* recently freed pointers, for double frees */
    unsigned n_freed;
    unsigned scope_depth;
    bool accumulated_reset; /* stow_stats_reset_accumulated ran: totals restart */
    bool rounding;          /* roundup_power2_divisions set */
} fz_state_t;

stow_stats_t fz_stats(fz_state_t *s);
/* The books agree with the shadow model and the device (counts, cheap). */
void fz_check_counts(fz_state_t *s, const char *after);
/* The counts, and the pool's own walk (stow_pool_check) passes. */
void fz_check_books(fz_state_t *s, const char *after);
/* The index of live block p in s->live, or -1. */
int fz_find(const fz_state_t *s, uintptr_t p);

/* ---- calls, each checked ---- */
/* Allocates size bytes on stream (nothing when FZ_MAX_LIVE blocks are live);
 * the new block's index in s->live, or -1 when none was made. */
int fz_alloc_sized(fz_state_t *s, size_t size, stow_stream_t stream);
/* A block the pool handed out (p, for `size` bytes on `stream`): checked
 * (alignment, its size, no overlap, the device-work oracle) and tracked as
 * live. Returns its index. */
int fz_track_new(fz_state_t *s, void *p, size_t size, stow_stream_t stream);
/* stow_pool_alloc_at(at, size, stream): tracked as fz_alloc_sized's when it
 * succeeds; a refusal (bytes not free, a page-mapped pool) changes no books.
 * Returns its index, or -1. */
int fz_alloc_at(fz_state_t *s, uintptr_t at, size_t size, stow_stream_t stream);
/* Frees live block s->live[i]; false when the device refused (and nothing changed). */
bool fz_free_live(fz_state_t *s, unsigned i);
/* A free the pool must reject: ENOTOWNED (EINVAL for NULL), nothing changed. */
void fz_bad_free(fz_state_t *s, void *p);
/* Decodes a fault injection on one kind of backend call. */
void fz_inject(fz_in_t *in);
/* set_memory_fraction as PyTorch calls it at run time. */
void fz_memory_fraction(fz_state_t *s, double fraction);

/* The end of an input: no more faults; with complete, every stream's work
 * done; scopes popped, everything freed, the pool destroyed, the device
 * empty and destroyed. Returns the device's counters before it went. */
stow_sim_counters_t fz_teardown(fz_state_t *s, bool complete);

#endif
