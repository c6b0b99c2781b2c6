/*
 * The store's background threads run while the program computes, between
 * calls: the first answer of StoreAll(2, level=1) follows a Save of u_0 to
 * the zarr level, whose write is queued to a worker thread.  The program then
 * makes no call and waits for the record to appear on disk (argv[1]: the zarr
 * store's path).  Prints "pending at return" if the write was not finished
 * when vlcc_run_next returned, then "written while the program waited".
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "vlcc.h"

#define SIZE (4 << 20) /* 32 MiB of float64 */

static void check(int rc, const char *what)
{
    if (rc != VLCC_OK) {
        printf("%s failed (%d): %s\n", what, rc, vlcc_last_error());
        exit(1);
    }
}

/* Whether the record of step 0 is complete in the store: a group (its zarr.json)
   beside the root's, outside the store's hidden scratch and lock directories. */
static int written(const char *store)
{
    char path[4096];
    struct stat st;
    DIR *d = opendir(store);
    int found = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "zarr.json") == 0)
            continue;
        snprintf(path, sizeof path, "%s/%s/zarr.json", store, e->d_name);
        if (stat(path, &st) == 0)
            found = 1;
    }
    if (d)
        closedir(d);
    return found;
}

int main(int argc, char **argv)
{
    const char *store = argc > 1 ? argv[1] : "background.zarr";
    char config[8192];
    snprintf(config, sizeof config,
             "{\"schedule\": {\"kind\": \"storeall\", \"steps\": 2, \"level\": 1}, \"store\": "
             "{\"tiers\": [{\"kind\": \"memory\"}, {\"kind\": \"zarr\", \"path\": \"%s\", "
             "\"mode\": \"w\"}]}}",
             store);
    double *u = malloc(sizeof(double) * SIZE);
    for (int64_t i = 0; i < SIZE; i++)
        u[i] = (double)i;
    int64_t shape = SIZE;
    vlcc_run *run;
    vlcc_action a;
    check(vlcc_run_open(&run, config), "open");
    check(vlcc_run_protect(run, "u", u, "float64", 1, &shape), "protect");
    check(vlcc_run_next(run, &a), "next");
    if (a.kind != VLCC_ADVANCE) {
        printf("expected ADVANCE first, got %d\n", (int)a.kind);
        return 1;
    }
    if (!written(store))
        printf("pending at return\n");
    struct timespec pause = {0, 2000000};
    for (int i = 0; i < 30000 && !written(store); i++) /* at most a minute */
        nanosleep(&pause, NULL);
    if (!written(store)) {
        printf("not written while the program waited\n");
        return 1;
    }
    printf("written while the program waited\n");
    while (a.kind != VLCC_DONE)
        check(vlcc_run_next(run, &a), "next");
    check(vlcc_run_close(run), "close");
    free(u);
    return 0;
}
