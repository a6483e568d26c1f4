/*
 * stowage/step_key.h: the rule every step key follows (stow_pool_step in
 * stowage.h, the 'm KEY' lines of a trace in stowage/trace.h).
 *
 * A key names what a step repeats: a training loop ("train"), a phase
 * ("eval"), a model and its shape bucket ("resnet50-bs64", "bert/len:128").
 * It is 1 to STOW_STEP_KEY_MAX characters, each a letter, a digit or one of
 * "_.:/-", so that it fits a trace line and a file name without quoting.
 */
#ifndef STOWAGE_STEP_KEY_H
#define STOWAGE_STEP_KEY_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STOW_STEP_KEY_MAX 64 /* characters, without the terminating NUL */

/* Whether key[0 .. len) is a valid step key. Thread safety: pure. */
static inline bool stow_step_key_valid(const char *key, size_t len)
{
    if (!key || len == 0 || len > STOW_STEP_KEY_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = key[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_STEP_KEY_H */
