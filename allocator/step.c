/*
 * allocator/step.c: step markers (stow_pool_step, stowage.h).
 *
 * A marker says where a step of the program begins (a key) or ends (NULL). It
 * is checked against the key rule (stowage/step_key.h), recorded with the
 * pool's events (record.c), and handed to the planned layer (planned_serve.c)
 * when planned_steps is on. It never changes a block: a pool without the
 * planned layer allocates exactly as it would without markers.
 */
#include "allocator/check.h"
#include "allocator/lock.h"
#include "allocator/planned_serve.h"
#include "allocator/pool.h"
#include "allocator/recorder.h"

#include <string.h>

stow_status_t stow_pool_step(stow_pool_t *pool, const char *key)
{
    if (!pool || (key && !stow_step_key_valid(key, strnlen(key, STOW_STEP_KEY_MAX + 1))))
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    stow__record_step(pool, key);
    if (pool->planned)
        stow__planned_step(pool, key);
    stow_assert_expensive(pool);
    stow__unlock(&pool->lock);
    return STOW_OK;
}
