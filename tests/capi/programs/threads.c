/*
 * Runs from threads: four threads, each with a run of its own, at the same
 * time (the interpreter was started by none of them but the first call); each
 * checks that its regions hold u_k as the answers say (u_k = k + thread).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "vlcc.h"

#define THREADS 4
#define STEPS 60

static void *work(void *arg)
{
    long me = (long)arg;
    double u[16];
    int64_t shape = 16;
    vlcc_run *run;
    vlcc_action a;
    long reverses = 0;
    for (int i = 0; i < 16; i++)
        u[i] = (double)me;
    if (vlcc_run_open(&run, "{\"schedule\": {\"kind\": \"revolve\", \"steps\": 60, "
                            "\"snapshots\": 5}}") != VLCC_OK ||
        vlcc_run_protect(run, "u", u, "float64", 1, &shape) != VLCC_OK) {
        printf("thread %ld: %s\n", me, vlcc_last_error());
        return (void *)1;
    }
    for (;;) {
        if (vlcc_run_next(run, &a) != VLCC_OK) {
            printf("thread %ld: %s\n", me, vlcc_last_error());
            return (void *)1;
        }
        if (a.kind == VLCC_DONE)
            break;
        int64_t k = a.kind == VLCC_ADVANCE ? a.from : a.to;
        for (int i = 0; i < 16; i++)
            if (u[i] != (double)(k + me)) {
                printf("thread %ld: regions do not hold u_%lld\n", me, (long long)k);
                return (void *)1;
            }
        if (a.kind == VLCC_ADVANCE)
            for (int i = 0; i < 16; i++)
                u[i] = (double)(a.to + me);
        else if (a.kind == VLCC_REVERSE)
            reverses++;
    }
    if (vlcc_run_close(run) != VLCC_OK || reverses != STEPS) {
        printf("thread %ld: %ld adjoint steps, %s\n", me, reverses, vlcc_last_error());
        return (void *)1;
    }
    return NULL;
}

int main(void)
{
    pthread_t threads[THREADS];
    for (long t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, work, (void *)t);
    int failed = 0;
    for (long t = 0; t < THREADS; t++) {
        void *result;
        pthread_join(threads[t], &result);
        failed |= result != NULL;
    }
    printf(failed ? "a thread failed\n" : "ok: %d threads\n", THREADS);
    return failed;
}
