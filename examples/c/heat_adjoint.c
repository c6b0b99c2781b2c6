/*
 * The gradient of a 1-D reaction-diffusion solver, checkpointed by vlcc-adjoint from C.
 *
 *   u_{i+1} = u_i + A L u_i - DT u_i^3      (L: the second difference, u = 0 outside)
 *   J(u_0)  = |u_n|^2 / 2
 *
 * The adjoint, written by hand: lambda_n = u_n, and
 *   lambda_i = lambda_{i+1} + A L lambda_{i+1} - 3 DT u_i^2 lambda_{i+1}
 * (L is symmetric), so lambda_0 = dJ/du_0.  Every adjoint step needs the
 * state u_i: that is what the schedule keeps or recomputes.
 *
 * The program computes the gradient three ways and checks that they agree
 * bit for bit:
 *   1. store-all: every state kept in an array (no vlcc);
 *   2. Revolve(N, 10) through vlcc, states in memory;
 *   3. a two-level Multistage through vlcc: memory and a zarr store on disk;
 * then a Taylor test of the Revolve gradient: the remainder
 * J(u_0 + h v) - J(u_0) - h <g, v> must shrink as h^2.
 *
 * Build and run (the flags carry an rpath: no environment variables needed):
 *   cc heat_adjoint.c $(python -m vlcc_adjoint.capi --cflags --libs) -lm -o heat_adjoint
 *   ./heat_adjoint [directory for the disk level, default .]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vlcc.h"

#define NX 200  /* grid points */
#define N 500   /* time steps */
#define A 0.25  /* diffusion number */
#define DT 0.01 /* reaction time step */

static void check(int rc, const char *what)
{
    if (rc != VLCC_OK) {
        fprintf(stderr, "%s failed (%d): %s\n", what, rc, vlcc_last_error());
        exit(1);
    }
}

/* out = v + A L v (L with u = 0 outside the grid). */
static void diffuse(const double *v, double *out)
{
    for (int k = 0; k < NX; k++) {
        double left = k > 0 ? v[k - 1] : 0.0, right = k < NX - 1 ? v[k + 1] : 0.0;
        out[k] = v[k] + A * (left - 2.0 * v[k] + right);
    }
}

/* One forward step, in place. */
static void step(double *u)
{
    double next[NX];
    diffuse(u, next);
    for (int k = 0; k < NX; k++)
        u[k] = next[k] - DT * u[k] * u[k] * u[k];
}

/* One adjoint step: lam <- (I + A L - 3 DT diag(u^2)) lam, with u = u_i. */
static void adjoint_step(const double *u, double *lam)
{
    double next[NX];
    diffuse(lam, next);
    for (int k = 0; k < NX; k++)
        lam[k] = next[k] - 3.0 * DT * u[k] * u[k] * lam[k];
}

static double objective(const double *u)
{
    double j = 0.0;
    for (int k = 0; k < NX; k++)
        j += 0.5 * u[k] * u[k];
    return j;
}

/* J(u0), forward only. */
static double forward(const double *u0)
{
    double u[NX];
    memcpy(u, u0, sizeof u);
    for (int i = 0; i < N; i++)
        step(u);
    return objective(u);
}

/* 1. Store-all: every state in memory. */
static void gradient_store_all(const double *u0, double *grad)
{
    double *states = malloc(sizeof(double) * NX * (N + 1));
    memcpy(states, u0, sizeof(double) * NX);
    for (int i = 0; i < N; i++) {
        memcpy(states + (size_t)(i + 1) * NX, states + (size_t)i * NX, sizeof(double) * NX);
        step(states + (size_t)(i + 1) * NX);
    }
    memcpy(grad, states + (size_t)N * NX, sizeof(double) * NX); /* lambda_n = u_n */
    for (int i = N - 1; i >= 0; i--)
        adjoint_step(states + (size_t)i * NX, grad);
    free(states);
}

/* 2., 3. Through vlcc: the schedule in config decides what is kept where. */
static void gradient_vlcc(const char *config, const double *u0, double *grad)
{
    double u[NX], lam[NX];
    int64_t nx = NX;
    vlcc_run *run;
    vlcc_action a;
    memcpy(u, u0, sizeof u);
    check(vlcc_run_open(&run, config), "vlcc_run_open");
    check(vlcc_run_protect(run, "u", u, "float64", 1, &nx), "vlcc_run_protect");
    for (;;) {
        check(vlcc_run_next(run, &a), "vlcc_run_next");
        if (a.kind == VLCC_DONE)
            break;
        if (a.kind == VLCC_ADVANCE) /* u holds u_from */
            for (int64_t i = a.from; i < a.to; i++)
                step(u);
        else if (a.kind == VLCC_TURN) /* u holds u_n */
            memcpy(lam, u, sizeof lam);
        else /* VLCC_REVERSE: u holds u_to */
            adjoint_step(u, lam);
    }
    check(vlcc_run_close(run), "vlcc_run_close");
    memcpy(grad, lam, sizeof lam);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    double u0[NX], reference[NX], revolve[NX], multistage[NX];
    for (int k = 0; k < NX; k++)
        u0[k] = sin(3.14159265358979 * (k + 1) / (NX + 1)) + 0.5 * sin(7.0 * k / NX);

    gradient_store_all(u0, reference);

    char config[1024];
    snprintf(config, sizeof config,
             "{\"schedule\": {\"kind\": \"revolve\", \"steps\": %d, \"snapshots\": 10}}", N);
    gradient_vlcc(config, u0, revolve);

    snprintf(config, sizeof config,
             "{\"schedule\": {\"kind\": \"multistage\", \"steps\": %d, \"levels\": "
             "[{\"slots\": 3}, {\"slots\": 12, \"write_cost\": 2, \"read_cost\": 2}]}, "
             "\"store\": {\"tiers\": [{\"kind\": \"memory\"}, "
             "{\"kind\": \"zarr\", \"path\": \"%s/heat_checkpoints.zarr\", \"mode\": \"w\"}]}}",
             N, dir);
    gradient_vlcc(config, u0, multistage);

    int same_revolve = memcmp(revolve, reference, sizeof reference) == 0;
    int same_multistage = memcmp(multistage, reference, sizeof reference) == 0;
    printf("Revolve(%d, 10) gradient bitwise equal to store-all: %s\n", N,
           same_revolve ? "yes" : "NO");
    printf("Multistage(memory 3 + zarr disk 12) gradient bitwise equal to store-all: %s\n",
           same_multistage ? "yes" : "NO");

    /* Taylor test: r(h) = |J(u0 + h v) - J(u0) - h <g, v>| = O(h^2). */
    double v[NX], shifted[NX], j0 = forward(u0), dj = 0.0;
    for (int k = 0; k < NX; k++) {
        v[k] = cos(5.0 * k / NX);
        dj += revolve[k] * v[k];
    }
    printf("Taylor test (remainder must shrink as h^2: order 2)\n");
    double previous = 0.0, worst = 3.0;
    for (int e = 0; e < 5; e++) {
        double h = 1e-2 / (1 << e);
        for (int k = 0; k < NX; k++)
            shifted[k] = u0[k] + h * v[k];
        double r = fabs(forward(shifted) - j0 - h * dj);
        if (e > 0) {
            double order = log(previous / r) / log(2.0);
            worst = order < worst ? order : worst;
            printf("  h = %.5f  remainder = %.3e  order = %.3f\n", h, r, order);
        } else {
            printf("  h = %.5f  remainder = %.3e\n", h, r);
        }
        previous = r;
    }
    int taylor = worst > 1.9;
    printf("Taylor test passed: %s\n", taylor ? "yes" : "NO");
    return same_revolve && same_multistage && taylor ? 0 : 1;
}
