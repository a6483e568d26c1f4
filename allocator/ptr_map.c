/*
 * allocator/ptr_map.c: address -> metadata hash map (open addressing, linear
 * probing, backward-shift deletion).
 *
 * Used by the pool to find the block behind a pointer on free, and by the
 * simulated device to validate (ptr, size) pairs. Keys are non-zero addresses;
 * lookups of foreign pointers simply miss, which is how a foreign free is
 * detected without trusting the pointer.
 */
#include "allocator/internal.h"

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
    map->keys = calloc(map->capacity, sizeof *map->keys);
    map->values = calloc(map->capacity, sizeof *map->values);
    if (!map->keys || !map->values) {
        stow__ptr_map_destroy(map);
        return STOW_EHOSTMEM;
    }
    return STOW_OK;
}

void stow__ptr_map_destroy(stow_ptr_map_t *map)
{
    free(map->keys);
    free(map->values);
    map->keys = NULL;
    map->values = NULL;
    map->capacity = map->count = 0;
}

static stow_status_t ptr_map_grow(stow_ptr_map_t *map)
{
    size_t new_capacity = map->capacity * 2;
    uintptr_t *keys = calloc(new_capacity, sizeof *keys);
    void **values = calloc(new_capacity, sizeof *values);
    if (!keys || !values) {
        free(keys);
        free(values);
        return STOW_EHOSTMEM;
    }
    size_t mask = new_capacity - 1;
    for (size_t i = 0; i < map->capacity; i++) {
        if (!map->keys[i])
            continue;
        size_t j = ptr_map_slot(map->keys[i], mask);
        while (keys[j])
            j = (j + 1) & mask;
        keys[j] = map->keys[i];
        values[j] = map->values[i];
    }
    free(map->keys);
    free(map->values);
    map->keys = keys;
    map->values = values;
    map->capacity = new_capacity;
    return STOW_OK;
}

void *stow__ptr_map_get(const stow_ptr_map_t *map, uintptr_t key)
{
    if (!key)
        return NULL;
    size_t mask = map->capacity - 1;
    for (size_t i = ptr_map_slot(key, mask);; i = (i + 1) & mask) {
        if (map->keys[i] == key)
            return map->values[i];
        if (!map->keys[i])
            return NULL;
    }
}

stow_status_t stow__ptr_map_reserve_one(stow_ptr_map_t *map)
{
    /* Keep the load under 1/2 so probes stay short. */
    if ((map->count + 1) * 2 > map->capacity)
        return ptr_map_grow(map);
    return STOW_OK;
}

void stow__ptr_map_put(stow_ptr_map_t *map, uintptr_t key, void *value)
{
    stow_assert(key != 0 && (map->count + 1) * 2 <= map->capacity);
    size_t mask = map->capacity - 1;
    size_t i = ptr_map_slot(key, mask);
    while (map->keys[i] && map->keys[i] != key)
        i = (i + 1) & mask;
    if (!map->keys[i])
        map->count++;
    map->keys[i] = key;
    map->values[i] = value;
}

void *stow__ptr_map_remove(stow_ptr_map_t *map, uintptr_t key)
{
    if (!key)
        return NULL;
    size_t mask = map->capacity - 1;
    size_t i = ptr_map_slot(key, mask);
    while (map->keys[i] != key) {
        if (!map->keys[i])
            return NULL;
        i = (i + 1) & mask;
    }
    void *value = map->values[i];
    /* Backward-shift deletion: pull later members of the probe run into the
     * hole so that lookups never stop early at it. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; map->keys[j]; j = (j + 1) & mask) {
        size_t home = ptr_map_slot(map->keys[j], mask);
        bool movable = (hole <= j) ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            map->keys[hole] = map->keys[j];
            map->values[hole] = map->values[j];
            hole = j;
        }
    }
    map->keys[hole] = 0;
    map->values[hole] = NULL;
    map->count--;
    return value;
}
