/*
 * tests/fuzz/fuzz_tags.c: libFuzzer target for the tag-file parser
 * (stow__report_tags_parse, report/report_tags.c, read by `stowage report` and
 * `stowage diff` next to a trace).
 *
 * The first input byte is the id count (0-255), the rest the file. Any input:
 * no crash and no read past the text (an exact-size heap copy). A rejected
 * file leaves a NUL-terminated message naming the input ("fuzz.tags:LINE: ..."
 * or "fuzz.tags: out of host memory"). An accepted one is checked against an
 * independent reading of the same text: every line is blank (spaces and tabs),
 * a '#' comment, or decimal digits whose value is below the id count, blanks,
 * and the tag; each id gets the tag of its last line (a final '\r' dropped),
 * every other id none.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"
#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool blank(char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }

/* The tag the text gives id (its last line), or NULL; *len its length. */
static const char *expected_tag(const char *text, size_t n, uint32_t id, size_t *len)
{
    const char *found = NULL;
    size_t pos = 0;
    while (pos < n) {
        size_t e = pos;
        while (e < n && text[e] != '\n')
            e++;
        size_t end = e > pos && text[e - 1] == '\r' ? e - 1 : e;
        size_t i = pos;
        while (i < end && blank(text[i]))
            i++;
        if (i < end && text[i] != '#') {
            uint64_t v = 0;
            size_t d = i;
            while (i < end && text[i] >= '0' && text[i] <= '9' && v <= UINT32_MAX)
                v = v * 10 + (uint64_t)(text[i++] - '0');
            FUZZ_CHECK(i > d && i < end && blank(text[i]), "accepted a line without '<id> '");
            while (i < end && blank(text[i]))
                i++;
            if (v == id) {
                found = text + i;
                *len = end - i;
            }
        }
        pos = e + 1;
    }
    return found;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint32_t id_count = data[0];
    size_t n = size - 1;
    char *text = malloc(n ? n : 1);
    FUZZ_CHECK(text != NULL, "host memory");
    memcpy(text, data + 1, n);
    char err[128];
    memset(err, 'x', sizeof err);
    const char **tags = stow__report_tags_parse("fuzz.tags", text, n, id_count, err, sizeof err);
    if (!tags) {
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL, "message not terminated");
        unsigned line = 0;
        FUZZ_CHECK(sscanf(err, "fuzz.tags:%u:", &line) == 1 ||
                       strcmp(err, "fuzz.tags: out of host memory") == 0,
                   "message does not name the input: '%s'", err);
        free(text);
        return 0;
    }
    for (uint32_t id = 0; id < id_count; id++) {
        size_t len = 0;
        const char *want = expected_tag(text, n, id, &len);
        if (!want) {
            FUZZ_CHECK(tags[id] == NULL, "id %u: tag '%s' from nowhere", id, tags[id]);
            continue;
        }
        FUZZ_CHECK(tags[id] && strlen(tags[id]) == len && memcmp(tags[id], want, len) == 0,
                   "id %u: tag differs", id);
    }
    stow__report_tags_free(tags, id_count);
    free(text);
    return 0;
}
