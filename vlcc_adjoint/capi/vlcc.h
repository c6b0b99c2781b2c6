/*
 * vlcc.h - the C interface of vlcc-adjoint: checkpoint schedules, storage
 * tiers and a versioned lineage for states held by a C, C++ or Fortran
 * program.
 *
 * Compile and link with the flags that
 *
 *     python -m vlcc_adjoint.capi --cflags --libs
 *
 * prints (it builds libvlcc on first use); a program built so runs from any
 * directory without environment variables.
 *
 * The program protects its memory regions (the state's arrays, by name)
 * and asks "what next?" (revolve's reverse communication):
 *
 *     vlcc_run *run;
 *     vlcc_action a;
 *     vlcc_run_open(&run, "{\"schedule\": {\"kind\": \"revolve\", "
 *                         "\"steps\": 1000, \"snapshots\": 10}}");
 *     vlcc_run_protect(run, "u", u, "float64", 1, &nx);   // u holds u_0
 *     while (vlcc_run_next(run, &a) == 0 && a.kind != VLCC_DONE) {
 *         if (a.kind == VLCC_ADVANCE)      for (i = a.from; i < a.to; i++) step(u, i);
 *         else if (a.kind == VLCC_TURN)    init_adjoint(u, lam);       // u holds u_n
 *         else                             adjoint_step(u, lam, a.to); // u holds u_{a.to}
 *     }
 *     vlcc_run_close(run);
 *
 * Each vlcc_run_next performs the saves, loads, moves and deletes the
 * schedule asks for (copying the regions into the engine's memory, or
 * restoring them, with the store's read-ahead and tiers) and returns what
 * the program must compute:
 *
 *   VLCC_ADVANCE  (from, to)     the regions hold u_from: advance them to u_to
 *   VLCC_TURN     (n, n)         the regions hold u_n: initialise the adjoint
 *   VLCC_REVERSE  (i + 1, i)     the regions hold u_i: apply the adjoint of step i
 *   VLCC_DONE                    the adjoint of step 0 was the last
 *
 * Lifetime rule: a protected region must stay valid, at the same address,
 * from its protect to the close of its run or history.  The engine reads and
 * writes it only during the calls of that handle, never in between: the
 * program may compute on it freely, and the engine's background work (writes
 * to slower levels, read-ahead) runs on its own copies meanwhile.
 *
 * Errors: every call returns VLCC_OK (0) or one of the VLCC_E_ codes below,
 * and vlcc_last_error() gives the message of the calling thread's last
 * error.  A NULL or closed handle is an error, never a crash.  A handle may
 * be used from any thread, by one thread at a time.
 *
 * The numbers in the enums below are read by the Python side of the
 * interface (vlcc_adjoint.capi): this header is their one definition.
 */
#ifndef VLCC_H
#define VLCC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vlcc_run vlcc_run;         /* an adjoint run under a schedule */
typedef struct vlcc_history vlcc_history; /* a versioned lineage (the Python History) */

/* What vlcc_run_next asks the program to do (vlcc_action.kind). */
enum { VLCC_ADVANCE = 1, VLCC_TURN = 2, VLCC_REVERSE = 3, VLCC_DONE = 4 };

typedef struct {
    int32_t kind;
    int64_t from;
    int64_t to;
} vlcc_action;

/* Return codes. */
enum {
    VLCC_OK = 0,
    VLCC_E_ARGUMENT = 1, /* a bad argument: NULL pointer, unknown dtype, bad shape,
                            malformed config_json, a region protected twice, ... */
    VLCC_E_HANDLE = 2,   /* a NULL or closed handle (or one of the other kind) */
    VLCC_E_STATE = 3,    /* a call out of order: protect after the first next, next
                            before any protect or after DONE, after a failed next */
    VLCC_E_STORAGE = 4,  /* the store or the history failed: I/O, a full tier,
                            a missing version, a locked store */
    VLCC_E_CORRUPT = 5,  /* a checkpoint failed its integrity check */
    VLCC_E_PYTHON = 6,   /* the embedded Python could not start or import vlcc_adjoint */
    VLCC_E_INTERNAL = 7  /* anything else (a bug: report it with the message) */
};

/* Bytes of the buffer vlcc_history_commit writes a version id into
   (12 hexadecimal characters and the NUL). */
#define VLCC_VERSION_SIZE 13

/* -- runs ---------------------------------------------------------------------

   config_json: the schedule with the Python constructors' arguments, and
   optionally the store, e.g.
     {"schedule": {"kind": "revolve", "steps": 1000, "snapshots": 10}}
     {"schedule": {"kind": "multistage", "steps": 1000,
                   "levels": [{"slots": 4}, {"slots": 40, "write_cost": 5, "read_cost": 5}]},
      "store": {"tiers": [{"kind": "memory"}, {"kind": "zarr", "path": "ckpt.zarr", "mode": "w"}]}}
   (see the documentation of vlcc_adjoint.capi for every key). */
int vlcc_run_open(vlcc_run **run, const char *config_json);

/* Protect a region: ndim extents in shape (C order, last index fastest;
   ndim 0 is a scalar and shape may be NULL), elements of dtype, numpy's name:
   "float64", "float32", "int64", "int32", ... The regions together are the
   state; their names are the keys Python sees.  Before the first next. */
int vlcc_run_protect(vlcc_run *run, const char *name, void *data, const char *dtype,
                     int32_t ndim, const int64_t *shape);

/* Perform the schedule's storage actions up to the next thing the program
   must compute, and write it into *action (see above). */
int vlcc_run_next(vlcc_run *run, vlcc_action *action);

/* Flush and close the store, forget the regions, free the handle. */
int vlcc_run_close(vlcc_run *run);

/* -- histories ----------------------------------------------------------------

   mode: "r" (read only), "a" (read and write; created if missing) or "w" (a
   new, empty history: one already at path is emptied; a directory holding
   anything else is refused). */
int vlcc_history_open(vlcc_history **h, const char *path, const char *mode);

/* Protect a region, as vlcc_run_protect. */
int vlcc_history_protect(vlcc_history *h, const char *name, void *data, const char *dtype,
                         int32_t ndim, const int64_t *shape);

/* Commit the regions as a new version on branch (NULL or "": the current
   one) and write its id into version (version_size >= VLCC_VERSION_SIZE; version
   may be NULL).  Returns once the regions are hashed and their new chunks
   copied: the program may change them at once; the version is written in the
   background and is visible to readers once complete. */
int vlcc_history_commit(vlcc_history *h, const char *branch, const char *message,
                        char *version, size_t version_size);

/* Fill the regions with a version: ref is a version id, a branch (then the
   current branch), a tag, or "HEAD~1", ... */
int vlcc_history_checkout(vlcc_history *h, const char *ref);

/* Finish the pending commits, close the history, free the handle. */
int vlcc_history_close(vlcc_history *h);

/* -- errors ------------------------------------------------------------------- */

/* The message of the calling thread's last error ("" if none); valid until
   that thread's next call. */
const char *vlcc_last_error(void);

/* For language bindings (the Fortran module): set the calling thread's
   error message and return code. */
int vlcc_set_last_error(int code, const char *message);

#ifdef __cplusplus
}
#endif

#endif /* VLCC_H */
