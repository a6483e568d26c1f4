/*
 * allocator/vmm_epochs.h: stream safety of remaps in a page-mapped pool
 * (vmm_epochs.c): the unmap epochs that tag granules as they become unused,
 * and the events that close them. The epochs' state lives here; the pool
 * embeds it (pool.h) and only vmm_epochs.c reads its fields: others ask for
 * the open epoch (stow__vmm_epoch_open). Includes no pool.
 */
#ifndef STOWAGE_ALLOCATOR_VMM_EPOCHS_H
#define STOWAGE_ALLOCATOR_VMM_EPOCHS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator/types.h"

/* Epochs closed by events, not yet seen complete (vmm_epochs.c): a
 * ring of at most STOW_VMM_CLOSURES; events[] holds one event per stream
 * that freed a block since that stream's previous closure. */
#define STOW_VMM_CLOSURES 8
typedef struct stow_vmm_closure {
    uint64_t epoch;
    stow_event_t *events;
    uint32_t count, capacity;
} stow_vmm_closure_t;

/* Granules that become unused are tagged with unmap_epoch; those tagged at
 * or below unmap_safe_epoch have no queued work left on them (a synchronize,
 * or events, showed it). */
typedef struct stow_vmm_epochs {
    uint64_t unmap_epoch;              /* starts at 1 */
    uint64_t unmap_safe_epoch;
    stow_vmm_closure_t closures[STOW_VMM_CLOSURES]; /* ring, oldest at closure_first */
    unsigned closure_first, closure_count;
    unsigned pushes_since_closure;     /* frees that left granules unused since the last */
    uint64_t closing_until_op;         /* epochs are closed while op_count is below it */
} stow_vmm_epochs_t;

static inline void stow__vmm_epochs_init(stow_vmm_epochs_t *epochs) { epochs->unmap_epoch = 1; }

/* The epoch in force: the tag of granules that become unused now. Inline:
 * every free that leaves granules unused reads it. */
static inline uint64_t stow__vmm_epoch_open(const stow_vmm_epochs_t *epochs)
{
    return epochs->unmap_epoch;
}

/* The loop holds without remaps (a step's end under a learned layout, or a
 * loop that settled by itself): epochs close no more until the next remap. */
static inline void stow__vmm_epochs_stop_closing(stow_vmm_epochs_t *epochs, uint64_t op_count)
{
    if (epochs->closing_until_op > op_count)
        epochs->closing_until_op = op_count;
}

/* Destroys the events of epochs not yet seen complete, and their arrays. */
void stow__vmm_drop_closures(stow_pool_t *pool, bool free_arrays);
/* A free on `freeing` just left granules unused: while the pool remaps, may
 * close the epoch (an event on each stream that freed). */
void stow__vmm_note_unused_pushed(stow_pool_t *pool, const stow_stream_state_t *freeing);
/* Before a remap unmaps unused granules whose runs' newest tag is `epoch`:
 * epochs are closed for a window of operations from now, and the granules are
 * made safe to unmap without a synchronize where they can be (known safe
 * already, or after waiting on events alone). True when they are, or when
 * `synced` (the caller synchronized since they were freed); false: the caller
 * must synchronize. */
bool stow__vmm_unused_ready(stow_pool_t *pool, uint64_t epoch, bool synced);
/* A page-mapped pool's granules unused so far have no queued work left
 * (after a device synchronize). */
void stow__vmm_synchronized(stow_pool_t *pool);
/* The epochs' invariants: the closed epochs lie between the safe one and the
 * open one, in order, within the ring (vmm_check.c calls it). */
stow_status_t stow__vmm_epochs_check(const stow_pool_t *pool, char *why, size_t why_len);

#endif /* STOWAGE_ALLOCATOR_VMM_EPOCHS_H */
