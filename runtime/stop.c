/*
 * stop.c — stopping a run cleanly on a signal. SIGTERM (a scheduler's
 * preemption or time limit), SIGINT (Ctrl-C) and SIGUSR1 (what a job asks
 * for ahead of its limit: sbatch --signal=USR1@60) let the step that is
 * running finish; then the run saves a checkpoint of the state after it
 * into --ckpt-dir (with checkpoints off too), rank 0 prints the flag that
 * resumes from it, and every rank exits 128 + the signal. A second signal
 * ends the process at once, mid-save or not (docs/runtime.md, "Stopping").
 *
 * The handler only records the signal. Whether to stop is decided at a
 * step boundary, collectively: `kill` reaches one rank, Slurm and mpirun
 * reach every rank but not at the same instant, and a rank that stopped
 * alone would leave the others waiting in the next step's collectives. So
 * at every boundary the ranks all-reduce which signals they caught (one
 * small all-reduce, bk_allreduce_sum, on either backend; none on one rank)
 * and all stop at the same step, on the same signal.
 */
#define _XOPEN_SOURCE 700   /* SA_RESTART */
#include "internal.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The signals a run stops on, in the order that picks one when ranks
 * caught different ones. */
static const int stop_signals[] = {SIGTERM, SIGINT, SIGUSR1};
enum { NSTOP = sizeof stop_signals / sizeof *stop_signals };

/* The first signal caught, 0 before one. */
static volatile sig_atomic_t caught;

static void on_signal(int sig)
{
    if (caught)
        _exit(128 + sig);   /* the second: at once (async-signal-safe) */
    caught = sig;
}

static const char *signal_name(int sig)
{
    return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

void stop_install(FsdRun *r)
{
    /* SA_RESTART: a signal in the middle of a write or an MPI call lets it
     * go on; only the boundary acts on it */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < NSTOP; k++)
        sigaddset(&sa.sa_mask, stop_signals[k]);
    for (int k = 0; k < NSTOP; k++)
        if (sigaction(stop_signals[k], &sa, NULL) != 0)
            rt_fail(r, "cannot install the handler for %s", signal_name(stop_signals[k]));
    const char *ms = getenv("FSD_TEST_STEP_SLEEP_MS");
    r->test_step_sleep_ms = ms ? atoi(ms) : 0;
}

int stop_agree(FsdRun *r)
{
    const int mine = caught;
    double v[NSTOP];
    for (int k = 0; k < NSTOP; k++)
        v[k] = mine == stop_signals[k];
    if (r->world > 1)
        bk_allreduce_sum(r, v, NSTOP);
    for (int k = 0; k < NSTOP; k++)
        if (v[k] > 0)
            return stop_signals[k];
    return 0;
}

void stop_run(FsdRun *r, int sig)
{
    r->stop_signal = sig;
    const char *dir = ckpt_save_now(r);
    if (r->rank != 0)
        return;
    const long long step = (long long)r->step, steps = (long long)r->cfg.steps;
    if (!dir)
        fprintf(stderr, "train: %s: stopped before step %lld of %lld, but its checkpoint could not "
                        "be written (above); --resume latest continues from the newest complete "
                        "one, if there is one\n",
                signal_name(sig), step, steps);
    else if (r->resume_auto)
        fprintf(stderr, "train: %s: stopped before step %lld of %lld; saved checkpoint %s. Resume "
                        "with: the same command (its --resume auto finds it), or --resume %s\n",
                signal_name(sig), step, steps, dir, dir);
    else
        fprintf(stderr, "train: %s: stopped before step %lld of %lld; saved checkpoint %s. Resume "
                        "with: --resume %s\n",
                signal_name(sig), step, steps, dir, dir);
    fflush(stderr);
}

void stop_test_pause(FsdRun *r)
{
    /* FSD_TEST_STEP_SLEEP_MS (tests only): a slow step, so that a test can
     * signal a run in the middle of it; cut short once a signal is caught,
     * in slices, since the handler may run on any thread */
    for (int left = r->test_step_sleep_ms; left > 0 && !caught; left -= 10) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}
