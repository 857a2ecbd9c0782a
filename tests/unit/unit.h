/*
 * unit.h — what the compiler's unit tests share: a check that counts and
 * prints, and loading a .fsd file through the front end (parse, sema,
 * model_build), exiting when it does not compile.
 */
#ifndef FSDPC_UNIT_H
#define FSDPC_UNIT_H

#include "fsdpc.h"

extern int unit_passed, unit_failed;

/* Counts the check and prints "ok   what" or "FAIL what". */
void check(bool ok, const char *what);
/* The model of the .fsd file at path; exits with a message when it cannot
 * be read or does not compile. */
Model *load(const char *path);
/* Prints "N passed, N failed"; the test's exit status. */
int unit_report(void);

#endif
