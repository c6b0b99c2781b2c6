/*
 * Bad calls: each prints "name|code|message" and the program goes on (a bad
 * call must return a code and leave a message, never crash).  argv[1] is a
 * scratch directory.
 */
#include <stdio.h>
#include <string.h>

#include "vlcc.h"

static void report(const char *name, int rc)
{
    const char *message = rc ? vlcc_last_error() : "";
    printf("%s|%d|", name, rc);
    for (const char *p = message; *p; p++) /* one line per case */
        putchar(*p == '\n' ? ' ' : *p);
    putchar('\n');
}

#define REVOLVE "{\"schedule\": {\"kind\": \"revolve\", \"steps\": 4, \"snapshots\": 2}}"

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    double u[3] = {1, 2, 3}, w[3] = {0, 0, 0};
    int64_t three = 3, minus = -1;
    vlcc_run *run = NULL, *closed = NULL;
    vlcc_history *h = NULL;
    vlcc_action a;
    char version[VLCC_VERSION_SIZE], path[4096];

    /* before anything is open (Python not started yet) */
    report("next_null_before_start", vlcc_run_next(NULL, &a));
    report("close_garbage_before_start", vlcc_run_close((vlcc_run *)0x1234));

    /* malformed configurations */
    report("open_null_out", vlcc_run_open(NULL, REVOLVE));
    report("open_null_config", vlcc_run_open(&run, NULL));
    report("open_bad_json", vlcc_run_open(&run, "{\"schedule\": "));
    report("open_unknown_kind", vlcc_run_open(&run, "{\"schedule\": {\"kind\": \"magic\"}}"));
    report("open_missing_argument",
           vlcc_run_open(&run, "{\"schedule\": {\"kind\": \"revolve\", \"steps\": 4}}"));
    report("open_unknown_key", vlcc_run_open(&run, "{\"schedule\": {\"kind\": \"revolve\", "
                                                   "\"steps\": 4, \"snapshots\": 2}, \"stor\": {}}"));
    report("open_bad_tier", vlcc_run_open(&run, "{\"schedule\": {\"kind\": \"revolve\", "
                                                "\"steps\": 4, \"snapshots\": 2}, \"store\": "
                                                "{\"tiers\": [{\"kind\": \"tape\"}]}}"));
    report("open_null_left", run == NULL ? 0 : 99);

    /* protect */
    report("open", vlcc_run_open(&run, REVOLVE));
    report("next_before_protect", vlcc_run_next(run, &a));
    report("protect_unknown_dtype", vlcc_run_protect(run, "u", u, "double", 1, &three));
    report("protect_null_name", vlcc_run_protect(run, NULL, u, "float64", 1, &three));
    report("protect_null_dtype", vlcc_run_protect(run, "u", u, NULL, 1, &three));
    report("protect_bad_ndim", vlcc_run_protect(run, "u", u, "float64", -2, &three));
    report("protect_null_shape", vlcc_run_protect(run, "u", u, "float64", 1, NULL));
    report("protect_negative_extent", vlcc_run_protect(run, "u", u, "float64", 1, &minus));
    report("protect_null_data", vlcc_run_protect(run, "u", NULL, "float64", 1, &three));
    report("protect_empty_name", vlcc_run_protect(run, "", u, "float64", 1, &three));
    report("protect", vlcc_run_protect(run, "u", u, "float64", 1, &three));
    report("protect_twice_same_name", vlcc_run_protect(run, "u", w, "float64", 1, &three));
    report("protect_twice_same_memory", vlcc_run_protect(run, "v", u + 1, "float64", 1, &three));
    report("next_null_action", vlcc_run_next(run, NULL));
    report("next", vlcc_run_next(run, &a));
    report("protect_after_start", vlcc_run_protect(run, "w", w, "float64", 1, &three));
    int rc;
    while ((rc = vlcc_run_next(run, &a)) == VLCC_OK && a.kind != VLCC_DONE)
        ;
    report("run_to_done", rc);
    report("next_after_done", vlcc_run_next(run, &a));
    report("next_after_done_again", vlcc_run_next(run, &a));
    closed = run;
    report("close", vlcc_run_close(run));
    report("close_closed", vlcc_run_close(closed));
    report("next_closed", vlcc_run_next(closed, &a));
    report("protect_closed", vlcc_run_protect(closed, "u", u, "float64", 1, &three));
    report("close_null", vlcc_run_close(NULL));
    report("next_garbage", vlcc_run_next((vlcc_run *)0x7777, &a));

    /* a store that fails in the middle of the run: a tier too small */
    report("open_small_tier", vlcc_run_open(&run, "{\"schedule\": {\"kind\": \"revolve\", "
                                                  "\"steps\": 4, \"snapshots\": 2}, \"store\": "
                                                  "{\"tiers\": [{\"kind\": \"memory\", "
                                                  "\"capacity_bytes\": 8}]}}"));
    report("protect_small", vlcc_run_protect(run, "u", u, "float64", 1, &three));
    report("next_store_full", vlcc_run_next(run, &a));
    report("next_after_failure", vlcc_run_next(run, &a));
    report("close_failed_run", vlcc_run_close(run));

    /* histories */
    snprintf(path, sizeof path, "%s/history", dir);
    report("history_open_bad_mode", vlcc_history_open(&h, path, "x"));
    report("history_open_null_path", vlcc_history_open(&h, NULL, "a"));
    snprintf(path, sizeof path, "%s/not-a-history", dir);
    report("history_open_w_refuses", vlcc_history_open(&h, path, "w"));
    snprintf(path, sizeof path, "%s/history", dir);
    report("history_open", vlcc_history_open(&h, path, "w"));
    report("history_commit_before_protect", vlcc_history_commit(h, NULL, "m", version, sizeof version));
    report("history_protect", vlcc_history_protect(h, "u", u, "float64", 1, &three));
    report("history_protect_twice", vlcc_history_protect(h, "u", w, "float64", 1, &three));
    report("history_commit_small_buffer", vlcc_history_commit(h, NULL, "m", version, 5));
    report("history_commit", vlcc_history_commit(h, NULL, "m", version, sizeof version));
    report("history_checkout_unknown", vlcc_history_checkout(h, "no-such-ref"));
    report("history_checkout_null", vlcc_history_checkout(h, NULL));
    report("history_as_run", vlcc_run_next((vlcc_run *)h, &a));
    report("history_close", vlcc_history_close(h));
    report("history_close_closed", vlcc_history_close(h));
    report("history_commit_closed", vlcc_history_commit(h, NULL, "m", version, sizeof version));
    report("history_open_read_only", vlcc_history_open(&h, path, "r"));
    report("history_protect_ro", vlcc_history_protect(h, "u", u, "float64", 1, &three));
    report("history_commit_read_only", vlcc_history_commit(h, NULL, "m", version, sizeof version));
    report("history_close_ro", vlcc_history_close(h));
    printf("the end\n");
    return 0;
}
