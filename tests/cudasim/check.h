/*
 * check.h — what cudasim's unit tests (test_device.cc, test_cublaslt.cc)
 * share: one line a check, counted, and expect_fail, which runs a call in
 * a forked child that must stop the way the fakes stop (sim_fail: exit 3,
 * "cudasim: rank R: ..." on stderr). Test-only, header-only.
 */
#ifndef CUDASIM_CHECK_H
#define CUDASIM_CHECK_H

#include "cuda_runtime_api.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>

static int failures, checks;

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s: ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    checks++;
    failures += !ok;
}

/* Runs f in a forked child, which must stop with exit 3 and a message
 * starting "cudasim: rank " and containing `want` on stderr. Everything
 * queued is run first, so the child inherits no work. */
static void expect_fail(const char *name, const char *want, const std::function<void()> &f)
{
    cudaDeviceSynchronize();
    fflush(stdout);
    int fd[2];
    if (pipe(fd) != 0) {
        perror("pipe");
        exit(1);
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        f();
        _exit(0);
    }
    close(fd[1]);
    std::string err;
    char buf[512];
    ssize_t got;
    while ((got = read(fd[0], buf, sizeof buf)) > 0)
        err.append(buf, (size_t)got);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    const bool exited3 = WIFEXITED(status) && WEXITSTATUS(status) == 3;
    if (!err.empty() && err.back() == '\n')
        err.pop_back();
    check(exited3 && err.rfind("cudasim: rank ", 0) == 0 && err.find(want) != std::string::npos,
          "refuses %s: exit %d, \"%s\"", name, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
          err.c_str());
}

#endif
