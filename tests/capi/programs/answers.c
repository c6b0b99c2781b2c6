/*
 * Runs the schedule of argv[1] (a config_json) on a state of four regions of
 * different dtypes and ranks, whose values encode the step: u_k holds k in
 * every element (plus the element's index).  Checks every answer against the
 * rules of vlcc.h: ADVANCE(from, to) with u_from in the regions, one TURN with
 * u_n before the first REVERSE, REVERSE(i + 1, i) with u_i for i = n - 1 .. 0
 * in order, then DONE.  After a TURN or a REVERSE it scribbles over the
 * regions (the state in hand is consumed there), so every later answer proves
 * that the engine restored them.  Prints a summary; exits 1 on a violation.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vlcc.h"

static double u[5];
static int32_t ids[2][3];
static float t;
static int64_t big[4];

static void set(int64_t k)
{
    for (int i = 0; i < 5; i++)
        u[i] = (double)k + 0.25 * i;
    for (int i = 0; i < 6; i++)
        ids[i / 3][i % 3] = (int32_t)(10 * k + i);
    t = (float)k;
    for (int i = 0; i < 4; i++)
        big[i] = 1000 * k - i;
}

static int holds(int64_t k)
{
    for (int i = 0; i < 5; i++)
        if (u[i] != (double)k + 0.25 * i)
            return 0;
    for (int i = 0; i < 6; i++)
        if (ids[i / 3][i % 3] != (int32_t)(10 * k + i))
            return 0;
    for (int i = 0; i < 4; i++)
        if (big[i] != 1000 * k - i)
            return 0;
    return t == (float)k;
}

static void scribble(void)
{
    memset(u, 0xAB, sizeof u);
    memset(ids, 0xCD, sizeof ids);
    memset(&t, 0xEF, sizeof t);
    memset(big, 0x12, sizeof big);
}

static void check(int rc, const char *what)
{
    if (rc != VLCC_OK) {
        printf("%s failed (%d): %s\n", what, rc, vlcc_last_error());
        exit(1);
    }
}

static void violation(const char *text, const vlcc_action *a)
{
    printf("violation: %s at answer (%d, %" PRId64 ", %" PRId64 ")\n", text, (int)a->kind,
           a->from, a->to);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: answers CONFIG_JSON STEPS\n");
        return 2;
    }
    int64_t n = atoll(argv[2]);
    int64_t shape_u[1] = {5}, shape_ids[2] = {2, 3}, shape_big[1] = {4};
    vlcc_run *run;
    vlcc_action a;
    set(0);
    check(vlcc_run_open(&run, argv[1]), "vlcc_run_open");
    check(vlcc_run_protect(run, "u", u, "float64", 1, shape_u), "protect u");
    check(vlcc_run_protect(run, "ids", ids, "int32", 2, shape_ids), "protect ids");
    check(vlcc_run_protect(run, "t", &t, "float32", 0, NULL), "protect t");
    check(vlcc_run_protect(run, "big", big, "int64", 1, shape_big), "protect big");
    long answers = 0, advances = 0, turns = 0, reverses = 0;
    int64_t expect = n - 1; /* the next adjoint step */
    for (;;) {
        check(vlcc_run_next(run, &a), "vlcc_run_next");
        answers++;
        if (a.kind == VLCC_DONE)
            break;
        if (a.kind == VLCC_ADVANCE) {
            if (!holds(a.from))
                violation("the regions do not hold u_from", &a);
            if (a.from >= a.to || a.to > n)
                violation("a bad step range", &a);
            advances += a.to - a.from;
            set(a.to);
        } else if (a.kind == VLCC_TURN) {
            if (turns++ || reverses)
                violation("TURN after a TURN or a REVERSE", &a);
            if (a.from != n || a.to != n || !holds(n))
                violation("TURN without u_n", &a);
            scribble();
        } else if (a.kind == VLCC_REVERSE) {
            if (!turns)
                violation("REVERSE before TURN", &a);
            if (a.to != expect || a.from != a.to + 1)
                violation("REVERSE out of order", &a);
            if (!holds(a.to))
                violation("the regions do not hold u_i", &a);
            expect--;
            reverses++;
            scribble();
        } else {
            violation("an unknown kind", &a);
        }
    }
    if (reverses != n || expect != -1)
        violation("not every adjoint step was asked for", &a);
    check(vlcc_run_close(run), "vlcc_run_close");
    printf("ok: %ld answers, %ld forward steps, %ld turn, %ld adjoint steps\n", answers, advances,
           turns, reverses);
    return 0;
}
