/*
 * A history of two regions, "u" (float64, argv[3] elements) and "n" (an int64
 * scalar); version k holds u[i] = k * 1e6 + i and n = k.
 *
 *   history commit PATH SIZE K [BRANCH]   commit versions 0 .. K-1, print "version k id"
 *   history commit-exit PATH SIZE K       the same, then exit without closing the history
 *   history checkout PATH SIZE REF        fill the regions from REF, print "n u[0] u[last]"
 *   history churn PATH SIZE               commit forever; every third version is waited for
 *                                         (a checkout, which detaches HEAD: the commits
 *                                         name their branch) and printed "visible k id"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vlcc.h"

static void check(int rc, const char *what)
{
    if (rc != VLCC_OK) {
        printf("%s failed (%d): %s\n", what, rc, vlcc_last_error());
        exit(1);
    }
}

static void fill(double *u, int64_t size, int64_t *n, int64_t k)
{
    for (int64_t i = 0; i < size; i++)
        u[i] = (double)k * 1e6 + (double)i;
    *n = k;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: history commit|checkout|churn PATH SIZE [K|REF]\n");
        return 2;
    }
    const char *what = argv[1], *path = argv[2];
    int64_t size = atoll(argv[3]), n = -1;
    double *u = calloc((size_t)size, sizeof(double));
    char version[VLCC_VERSION_SIZE];
    vlcc_history *h;
    check(vlcc_history_open(&h, path, strcmp(what, "checkout") == 0 ? "r" : "a"), "open");
    check(vlcc_history_protect(h, "u", u, "float64", 1, &size), "protect u");
    check(vlcc_history_protect(h, "n", &n, "int64", 0, NULL), "protect n");
    if (strcmp(what, "commit") == 0 || strcmp(what, "commit-exit") == 0) {
        int64_t count = argc > 4 ? atoll(argv[4]) : 1;
        const char *branch = argc > 5 ? argv[5] : NULL;
        for (int64_t k = 0; k < count; k++) {
            fill(u, size, &n, k);
            check(vlcc_history_commit(h, branch, "from C", version, sizeof version), "commit");
            memset(u, 0, sizeof(double) * (size_t)size); /* the state was owned at return */
            printf("version %lld %s\n", (long long)k, version);
        }
        if (strcmp(what, "commit-exit") == 0)
            return 0; /* libvlcc closes what is left open at exit */
    } else if (strcmp(what, "checkout") == 0) {
        check(vlcc_history_checkout(h, argc > 4 ? argv[4] : "HEAD"), "checkout");
        printf("%lld %.1f %.1f\n", (long long)n, u[0], u[size - 1]);
    } else {
        for (int64_t k = 0;; k++) {
            fill(u, size, &n, k);
            check(vlcc_history_commit(h, "main", "churn", version, sizeof version), "commit");
            if (k % 3 == 0) {
                check(vlcc_history_checkout(h, version), "checkout"); /* waits for the commit */
                if (n != k || u[size - 1] != (double)k * 1e6 + (double)(size - 1)) {
                    printf("checkout of %s gave the wrong state\n", version);
                    return 1;
                }
                printf("visible %lld %s\n", (long long)k, version);
                fflush(stdout);
            }
        }
    }
    check(vlcc_history_close(h), "close");
    free(u);
    return 0;
}
