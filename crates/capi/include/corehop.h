/*
 * corehop.h: the C API of corehop (link with -lcorehop).
 *
 * O² object scheduling with the O² paper's annotations: the code between ct_start(obj) and
 * ct_end() is an operation on obj, and it runs on the core whose cache holds obj. corehop
 * monitors every operation (TSC timing), packs the objects that are expensive to fetch into
 * the cores' cache budgets, and rebalances them; other objects' operations run where the
 * caller is, as without annotations.
 *
 *     corehop_init();
 *     ct_object(dir, sizeof *dir);          // optional: declare how many bytes it touches
 *     ...
 *     ct_start(dir);                         // moves this thread to dir's core, locks dir
 *     for (i = 0; i < dir->n; i++) ...      // the operation
 *     ct_end();                              // unlocks; the thread stays on that core
 *     ...
 *     corehop_shutdown();
 *
 * Moving: a plain C thread moves itself with sched_setaffinity (the paper's V1) and stays
 * pinned to the core of its last operation until its next ct_start moves it again.
 * Exclusion: ct_start takes obj's lock and ct_end releases it, so two operations on one
 * object never overlap (like the per-directory spin locks of the paper). Operations do not
 * nest: a thread has at most one operation open.
 *
 * Every call returns 0 on success and -1 on failure; corehop_last_error() then says why.
 * All functions are thread-safe.
 */
#ifndef COREHOP_H
#define COREHOP_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Starts the object scheduler on every CPU this process may use. Calling it twice fails. */
int corehop_init(void);

/* Stops the object scheduler and forgets every object; operations still open fail at
 * ct_end. corehop_init may be called again afterwards. */
int corehop_shutdown(void);

/* Declares obj and the bytes its operations touch. Objects never declared are added at their
 * first ct_start with COREHOP_DEFAULT_OBJECT_BYTES. Declaring an object twice fails. */
int ct_object(const void *obj, size_t bytes);

/* Bytes assumed for objects ct_start adds without a ct_object declaration. */
#define COREHOP_DEFAULT_OBJECT_BYTES 4096

/* Starts an operation on obj: moves the calling thread to obj's core (if obj is scheduled)
 * and takes obj's lock. Fails if this thread already has an operation open. */
int ct_start(const void *obj);

/* Ends this thread's open operation: releases the lock and records its cost. */
int ct_end(void);

/* Where obj's operations run: a CPU number (the kernel's) when obj is scheduled to one core,
 * -1 when they run on the caller's core (not scheduled, replicated or in the caller's shared
 * cache domain), -2 when obj is unknown or corehop is not started. */
int ct_where(const void *obj);

/* Counts of objects by placement: not scheduled, on one core, in a shared-cache domain,
 * replicated. Any pointer may be NULL. */
int corehop_census(size_t *local, size_t *core, size_t *domain, size_t *replicated);

/* Why the last failing call on this thread failed (never NULL). The string stays valid
 * while the thread lives and until sixteen more calls on it have failed. */
const char *corehop_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* COREHOP_H */
