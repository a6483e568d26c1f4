/*
 * allocator/ptr_map.h: the open-addressing map from an address to a pointer
 * (ptr_map.c): the pool's live map, the planned layer's, the simulated
 * device's. A layer of its own: it knows no block and no pool.
 */
#ifndef STOWAGE_ALLOCATOR_PTR_MAP_H
#define STOWAGE_ALLOCATOR_PTR_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "allocator/assert.h"
#include "stowage.h"

typedef struct stow_ptr_slot {
    uintptr_t key; /* 0 = empty */
    void *value;
} stow_ptr_slot_t;

typedef struct stow_ptr_map {
    stow_ptr_slot_t *slots; /* key and value side by side: one cache line per probe */
    size_t capacity;        /* power of two */
    size_t count;
} stow_ptr_map_t;

stow_status_t stow__ptr_map_init(stow_ptr_map_t *map);
void stow__ptr_map_destroy(stow_ptr_map_t *map);
void *stow__ptr_map_get(const stow_ptr_map_t *map, uintptr_t key);
stow_status_t stow__ptr_map_grow(stow_ptr_map_t *map);
/* Makes room for one more key; call before put, which cannot fail. The load
 * stays at most 1/4: most lookups then end at their home slot, which makes
 * the probe loops predictable. */
static inline stow_status_t stow__ptr_map_reserve_one(stow_ptr_map_t *map)
{
    return STOW_LIKELY((map->count + 1) * 4 <= map->capacity) ? STOW_OK : stow__ptr_map_grow(map);
}
void stow__ptr_map_put(stow_ptr_map_t *map, uintptr_t key, void *value);
void *stow__ptr_map_remove(stow_ptr_map_t *map, uintptr_t key);
/* The slot holding key, or NULL; stow__ptr_map_remove_slot removes it without
 * probing again (the free path looks a pointer up, then drops it). */
stow_ptr_slot_t *stow__ptr_map_find(const stow_ptr_map_t *map, uintptr_t key);
void stow__ptr_map_remove_slot(stow_ptr_map_t *map, stow_ptr_slot_t *slot);

#endif /* STOWAGE_ALLOCATOR_PTR_MAP_H */
