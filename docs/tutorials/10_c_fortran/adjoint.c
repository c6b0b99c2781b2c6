/* The gradient of a small reaction-diffusion solver, checkpointed by vlcc, in C.
 *
 *   u_{i+1} = u_i + A L u_i - DT u_i^3,   J = |u_N|^2 / 2,   lambda_0 = dJ/du_0
 *
 * argv[1]: the history the gradient is committed to (branch "c").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vlcc.h"

#define NX 64
#define N 1000
#define A 0.25
#define DT 0.01

static void check(int rc, const char *what)
{
    if (rc != VLCC_OK) {
        fprintf(stderr, "%s failed (%d): %s\n", what, rc, vlcc_last_error());
        exit(1);
    }
}

/* out = v + A L v, with zeros outside the grid */
static void diffuse(const double *v, double *out)
{
    for (int k = 0; k < NX; k++) {
        double left = k > 0 ? v[k - 1] : 0.0, right = k < NX - 1 ? v[k + 1] : 0.0;
        out[k] = v[k] + A * (left - 2.0 * v[k] + right);
    }
}

static void step(double *u)
{
    double next[NX];
    diffuse(u, next);
    for (int k = 0; k < NX; k++)
        u[k] = next[k] - DT * u[k] * u[k] * u[k];
}

/* lam <- (I + A L - 3 DT diag(u_i^2)) lam: needs the state u_i */
static void adjoint_step(const double *u, double *lam)
{
    double next[NX];
    diffuse(lam, next);
    for (int k = 0; k < NX; k++)
        lam[k] = next[k] - 3.0 * DT * u[k] * u[k] * lam[k];
}

int main(int argc, char **argv)
{
    double u[NX], u0[NX], lam[NX];
    int64_t nx = NX;
    long forward_steps = 0;
    for (int k = 0; k < NX; k++)
        u0[k] = u[k] = (double)(k * (NX - 1 - k)) / (NX * NX / 4);

    vlcc_run *run;
    vlcc_action a;
    check(vlcc_run_open(&run, "{\"schedule\": {\"kind\": \"revolve\", \"steps\": 1000, "
                              "\"snapshots\": 8}}"),
          "vlcc_run_open");
    check(vlcc_run_protect(run, "u", u, "float64", 1, &nx), "vlcc_run_protect"); /* u = u_0 */
    for (;;) {
        check(vlcc_run_next(run, &a), "vlcc_run_next");
        if (a.kind == VLCC_DONE)
            break;
        if (a.kind == VLCC_ADVANCE) { /* u holds u_from: advance it to u_to */
            for (int64_t i = a.from; i < a.to; i++)
                step(u);
            forward_steps += a.to - a.from;
        } else if (a.kind == VLCC_TURN) { /* u holds u_N: the adjoint's seed dJ/du_N */
            memcpy(lam, u, sizeof lam);
        } else { /* VLCC_REVERSE: u holds u_to */
            adjoint_step(u, lam);
        }
    }
    check(vlcc_run_close(run), "vlcc_run_close");
    printf("C: %d adjoint steps, %ld forward steps, %d states of memory\n", N, forward_steps, 8);

    /* version the input and the gradient: Python, zarr and Fortran read them */
    vlcc_history *h;
    char version[VLCC_VERSION_SIZE];
    check(vlcc_history_open(&h, argc > 1 ? argv[1] : "history", "a"), "vlcc_history_open");
    check(vlcc_history_protect(h, "u0", u0, "float64", 1, &nx), "vlcc_history_protect");
    check(vlcc_history_protect(h, "gradient", lam, "float64", 1, &nx), "vlcc_history_protect");
    check(vlcc_history_commit(h, "c", "the gradient, from C", version, sizeof version),
          "vlcc_history_commit");
    check(vlcc_history_close(h), "vlcc_history_close");
    printf("C: committed version %s on branch c\n", version);
    return 0;
}
