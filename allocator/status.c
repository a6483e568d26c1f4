/*
 * allocator/status.c: the strings behind stow_status_t, generated from the
 * one X-macro in stowage/status.h so that codes and messages cannot drift.
 */
#include "stowage/status.h"

const char *stow_strerror(stow_status_t status)
{
    switch (status) {
#define STOW_STATUS_MSG_(code, msg) \
    case STOW_##code:               \
        return msg;
        STOW_STATUS_MAP(STOW_STATUS_MSG_)
#undef STOW_STATUS_MSG_
    default:
        return "unknown status";
    }
}

const char *stow_status_name(stow_status_t status)
{
    switch (status) {
#define STOW_STATUS_NAME_(code, msg) \
    case STOW_##code:                \
        return #code;
        STOW_STATUS_MAP(STOW_STATUS_NAME_)
#undef STOW_STATUS_NAME_
    default:
        return "UNKNOWN";
    }
}
