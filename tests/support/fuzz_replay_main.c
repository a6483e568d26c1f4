/*
 * tests/support/fuzz_replay_main.c: runs a libFuzzer target's entry point on
 * every file of a corpus directory, without libFuzzer. CMake links it with
 * each tests/fuzz/fuzz_*.c into replay_fuzz_* so that ctest (gcc, and the
 * ASan build) replays the committed corpora, regression inputs included, on
 * every run: a check failure in the target aborts, which fails the test.
 *
 *   replay_fuzz_api tests/fuzz/corpus/api
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads path into an exact-size heap buffer (so ASan catches over-reads). */
static uint8_t *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint8_t *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc(n ? (size_t)n : 1);
        if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    *size = n > 0 ? (size_t)n : 0;
    return buf;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    DIR *dir = opendir(argv[1]);
    if (!dir) {
        perror(argv[1]);
        return 2;
    }
    char **names = NULL;
    size_t count = 0, cap = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] == '.')
            continue;
        if (count == cap) {
            cap = cap ? cap * 2 : 256;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown)
                return 2;
            names = grown;
        }
        if (!(names[count++] = strdup(e->d_name)))
            return 2;
    }
    closedir(dir);
    qsort(names, count, sizeof *names, cmp_names); /* the same order every run */
    for (size_t i = 0; i < count; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], names[i]);
        size_t size;
        uint8_t *data = read_file(path, &size);
        if (!data) {
            fprintf(stderr, "%s: cannot read\n", path);
            return 2;
        }
        LLVMFuzzerTestOneInput(data, size);
        free(data);
        free(names[i]);
    }
    free(names);
    printf("%s: %zu inputs replayed\n", argv[1], count);
    return 0;
}
