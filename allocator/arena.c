/*
 * allocator/arena.c: a planned arena (stowage/arena.h): one pool block of the
 * plan's height, and the planned offsets into it.
 */
#include "stowage/arena.h"

#include <stdlib.h>
#include <string.h>

struct stow_arena {
    stow_pool_t *pool;
    void *block;       /* from stow_pool_alloc */
    uintptr_t base;    /* block aligned up to the largest alignment */
    size_t bytes;      /* block size */
    size_t count;
    uint64_t *offsets; /* count */
    struct arena_name {
        char *id;
        size_t index;
    } *names;          /* sorted by id, for lookups by name */
    size_t name_count;
};

static int by_id(const void *a, const void *b)
{
    return strcmp(((const struct arena_name *)a)->id, ((const struct arena_name *)b)->id);
}

static void arena_free(stow_arena_t *a)
{
    for (size_t i = 0; i < a->name_count; i++)
        free(a->names[i].id);
    free(a->names);
    free(a->offsets);
    free(a);
}

static stow_status_t copy_names(stow_arena_t *a, const stow_plan_problem_t *problem)
{
    a->names = calloc(problem->count ? problem->count : 1, sizeof *a->names);
    if (!a->names)
        return STOW_EHOSTMEM;
    for (size_t i = 0; i < problem->count; i++) {
        if (!problem->buffers[i].id)
            continue;
        char *id = strdup(problem->buffers[i].id);
        if (!id)
            return STOW_EHOSTMEM;
        a->names[a->name_count].id = id;
        a->names[a->name_count].index = i;
        a->name_count++;
    }
    qsort(a->names, a->name_count, sizeof *a->names, by_id);
    return STOW_OK;
}

stow_status_t stow_arena_create(stow_pool_t *pool, const stow_plan_problem_t *problem,
                                const stow_plan_result_t *plan, stow_stream_t stream,
                                stow_arena_t **out)
{
    if (!pool || !problem || !plan || !out || plan->count != problem->count || !plan->offsets)
        return STOW_EINVAL;
    /* The plan is checked independently of whoever made it. */
    if (stow_plan_validate(problem, plan->offsets, 0, NULL, 0) != STOW_OK)
        return STOW_EINVAL;
    uint64_t align = 512, height = 0;
    for (size_t i = 0; i < problem->count; i++) {
        uint64_t al = problem->buffers[i].alignment;
        if (al == 0 || (al & (al - 1)))
            return STOW_EINVAL;
        if (al > align)
            align = al;
        uint64_t end;
        if (__builtin_add_overflow(plan->offsets[i], problem->buffers[i].size, &end))
            return STOW_EOVERFLOW;
        if (end > height)
            height = end;
    }
    /* The pool's blocks are 512-aligned; larger alignments need room to slide. */
    uint64_t bytes;
    if (__builtin_add_overflow(height ? height : 1, align - 512, &bytes) || bytes > SIZE_MAX)
        return STOW_EOVERFLOW;
    stow_arena_t *a = calloc(1, sizeof *a);
    if (!a)
        return STOW_EHOSTMEM;
    a->pool = pool;
    a->count = problem->count;
    a->bytes = (size_t)bytes;
    a->offsets = malloc((a->count ? a->count : 1) * sizeof *a->offsets);
    stow_status_t st = a->offsets ? copy_names(a, problem) : STOW_EHOSTMEM;
    if (st == STOW_OK) {
        memcpy(a->offsets, plan->offsets, a->count * sizeof *a->offsets);
        st = stow_pool_alloc(pool, a->bytes, stream, &a->block);
    }
    if (st != STOW_OK) {
        arena_free(a);
        return st;
    }
    a->base = ((uintptr_t)a->block + (uintptr_t)(align - 1)) & ~(uintptr_t)(align - 1);
    *out = a;
    return STOW_OK;
}

void *stow_arena_ptr(const stow_arena_t *arena, size_t index)
{
    if (!arena || index >= arena->count)
        return NULL;
    return (void *)(arena->base + (uintptr_t)arena->offsets[index]);
}

void *stow_arena_ptr_by_id(const stow_arena_t *arena, const char *id)
{
    if (!arena || !id)
        return NULL;
    struct arena_name key = {(char *)(uintptr_t)id, 0};
    const struct arena_name *hit =
        bsearch(&key, arena->names, arena->name_count, sizeof key, by_id);
    return hit ? stow_arena_ptr(arena, hit->index) : NULL;
}

size_t stow_arena_bytes(const stow_arena_t *arena) { return arena ? arena->bytes : 0; }

stow_status_t stow_arena_destroy(stow_arena_t *arena)
{
    if (!arena)
        return STOW_OK;
    stow_status_t st = stow_pool_free(arena->pool, arena->block);
    arena_free(arena);
    return st;
}
