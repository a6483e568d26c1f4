/*
 * allocator/ptr_map.c: address -> metadata hash map (open addressing, linear
 * probing, backward-shift deletion).
 *
 * Used by the pool to find the block behind a pointer on free, and by the
 * simulated device to validate (ptr, size) pairs. Keys are non-zero addresses;
 * lookups of foreign pointers simply miss, which is how a foreign free is
 * detected without trusting the pointer.
 */
#include "allocator/assert.h"
#include "allocator/ptr_map.h"

#include <stdlib.h>

#define PTR_MAP_MIN_CAPACITY 64u

static size_t ptr_map_slot(uintptr_t key, size_t mask)
{
    /* Block addresses are multiples of 512; the multiply spreads the high bits. */
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & mask;
}

stow_status_t stow__ptr_map_init(stow_ptr_map_t *map)
{
    map->capacity = PTR_MAP_MIN_CAPACITY;
    map->count = 0;
    map->slots = calloc(map->capacity, sizeof *map->slots);
    return map->slots ? STOW_OK : STOW_EHOSTMEM;
}

void stow__ptr_map_destroy(stow_ptr_map_t *map)
{
    free(map->slots);
    map->slots = NULL;
    map->capacity = map->count = 0;
}

stow_status_t stow__ptr_map_grow(stow_ptr_map_t *map)
{
    size_t new_capacity = map->capacity * 2;
    stow_ptr_slot_t *slots = calloc(new_capacity, sizeof *slots);
    if (!slots)
        return STOW_EHOSTMEM;
    size_t mask = new_capacity - 1;
    for (size_t i = 0; i < map->capacity; i++) {
        if (!map->slots[i].key)
            continue;
        size_t j = ptr_map_slot(map->slots[i].key, mask);
        while (slots[j].key)
            j = (j + 1) & mask;
        slots[j] = map->slots[i];
    }
    free(map->slots);
    map->slots = slots;
    map->capacity = new_capacity;
    return STOW_OK;
}

void *stow__ptr_map_get(const stow_ptr_map_t *map, uintptr_t key)
{
    stow_ptr_slot_t *slot = stow__ptr_map_find(map, key);
    return slot ? slot->value : NULL;
}

void stow__ptr_map_put(stow_ptr_map_t *map, uintptr_t key, void *value)
{
    stow_assert(key != 0 && (map->count + 1) * 4 <= map->capacity);
    size_t mask = map->capacity - 1;
    size_t i = ptr_map_slot(key, mask);
    while (map->slots[i].key && map->slots[i].key != key)
        i = (i + 1) & mask;
    if (!map->slots[i].key)
        map->count++;
    map->slots[i].key = key;
    map->slots[i].value = value;
}

stow_ptr_slot_t *stow__ptr_map_find(const stow_ptr_map_t *map, uintptr_t key)
{
    if (!key)
        return NULL;
    size_t mask = map->capacity - 1;
    for (size_t i = ptr_map_slot(key, mask);; i = (i + 1) & mask) {
        if (map->slots[i].key == key)
            return &map->slots[i];
        if (!map->slots[i].key)
            return NULL;
    }
}

void stow__ptr_map_remove_slot(stow_ptr_map_t *map, stow_ptr_slot_t *slot)
{
    size_t mask = map->capacity - 1;
    /* Backward-shift deletion: pull later members of the probe run into the
     * hole so that lookups never stop early at it. */
    size_t hole = (size_t)(slot - map->slots);
    for (size_t j = (hole + 1) & mask; map->slots[j].key; j = (j + 1) & mask) {
        size_t home = ptr_map_slot(map->slots[j].key, mask);
        bool movable = (hole <= j) ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            map->slots[hole] = map->slots[j];
            hole = j;
        }
    }
    map->slots[hole].key = 0;
    map->slots[hole].value = NULL;
    map->count--;
}

void *stow__ptr_map_remove(stow_ptr_map_t *map, uintptr_t key)
{
    stow_ptr_slot_t *slot = stow__ptr_map_find(map, key);
    if (!slot)
        return NULL;
    void *value = slot->value;
    stow__ptr_map_remove_slot(map, slot);
    return value;
}
