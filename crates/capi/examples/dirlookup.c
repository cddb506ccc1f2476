/*
 * dirlookup.c: the O² paper's directory-lookup workload (Figure 3) in C, annotated with
 * ct_start/ct_end. Each thread repeatedly looks up a random file name in a random directory;
 * each directory is an object and each search an operation.
 *
 * Build (from the repository root, after `cargo build -p corehop-capi`):
 *   cc -O2 -Icrates/capi/include crates/capi/examples/dirlookup.c -Ltarget/debug -lcorehop \
 *      -lpthread -o dirlookup && LD_LIBRARY_PATH=target/debug ./dirlookup [dirs] [lookups/thread]
 *
 * Prints one "key: value" line per result; exits non-zero if any lookup went wrong.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corehop.h"

#define ENTRIES 1000 /* entries per directory, as in the paper */
#define NAME 32      /* bytes per entry, as in the paper */

struct entry {
    char name[NAME];
};

struct dir {
    struct entry file[ENTRIES];
};

static struct dir *dirs;
static int ndirs;
static long lookups_per_thread;

/* Deterministic names: directory d, file f. */
static void name_of(char *out, int d, int f) {
    memset(out, 0, NAME);
    snprintf(out, NAME, "dir%05d-file%04d", d, f);
}

struct result {
    long found;
    long errors;
    uint64_t seed;
};

static uint64_t next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

static void *worker(void *arg) {
    struct result *r = arg;
    char want[NAME];
    for (long i = 0; i < lookups_per_thread; i++) {
        int d = (int)(next(&r->seed) % (uint64_t)ndirs);
        int f = (int)(next(&r->seed) % ENTRIES);
        name_of(want, d, f);
        struct dir *dir = &dirs[d];
        if (ct_start(dir) != 0) {
            fprintf(stderr, "ct_start: %s\n", corehop_last_error());
            r->errors++;
            continue;
        }
        int hit = -1;
        for (int e = 0; e < ENTRIES; e++)
            if (memcmp(dir->file[e].name, want, NAME) == 0) {
                hit = e;
                break;
            }
        if (ct_end() != 0) {
            fprintf(stderr, "ct_end: %s\n", corehop_last_error());
            r->errors++;
        }
        if (hit == f)
            r->found++;
        else
            r->errors++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    ndirs = argc > 1 ? atoi(argv[1]) : 64;
    lookups_per_thread = argc > 2 ? atol(argv[2]) : 20000;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (ndirs <= 0 || lookups_per_thread <= 0 || threads <= 0) {
        fprintf(stderr, "usage: dirlookup [dirs > 0] [lookups per thread > 0]\n");
        return 2;
    }
    if (corehop_init() != 0) {
        fprintf(stderr, "corehop_init: %s\n", corehop_last_error());
        return 1;
    }
    /* Misuse is reported, not fatal. */
    int misuse_ok = ct_end() == -1 && strstr(corehop_last_error(), "no operation open") != NULL;

    dirs = calloc((size_t)ndirs, sizeof *dirs);
    for (int d = 0; d < ndirs; d++) {
        for (int f = 0; f < ENTRIES; f++)
            name_of(dirs[d].file[f].name, d, f);
        ct_object(&dirs[d], sizeof dirs[d]);
    }

    pthread_t tid[256];
    struct result res[256];
    if (threads > 256)
        threads = 256;
    for (int t = 0; t < threads; t++) {
        res[t] = (struct result){0, 0, 0x9E3779B97F4A7C15ULL * (uint64_t)(t + 1)};
        pthread_create(&tid[t], NULL, worker, &res[t]);
    }
    long found = 0, errors = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        found += res[t].found;
        errors += res[t].errors;
    }
    size_t local = 0, core = 0, domain = 0, replicated = 0;
    corehop_census(&local, &core, &domain, &replicated);
    printf("threads: %d\n", threads);
    printf("directories: %d\n", ndirs);
    printf("lookups: %ld\n", (long)threads * lookups_per_thread);
    printf("found: %ld\n", found);
    printf("errors: %ld\n", errors);
    printf("misuse reported: %s\n", misuse_ok ? "yes" : "no");
    printf("placement: local=%zu core=%zu domain=%zu replicated=%zu\n", local, core, domain, replicated);
    if (corehop_shutdown() != 0) {
        fprintf(stderr, "corehop_shutdown: %s\n", corehop_last_error());
        return 1;
    }
    free(dirs);
    return errors == 0 && misuse_ok ? 0 : 1;
}
