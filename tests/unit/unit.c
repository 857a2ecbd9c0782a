/*
 * unit.c — the helpers tests/unit/unit.h declares.
 */
#include "unit.h"

#include <stdlib.h>

int unit_passed, unit_failed;

void check(bool ok, const char *what)
{
    if (ok)
        unit_passed++;
    else
        unit_failed++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

Model *load(const char *path)
{
    Source *src = source_read(path);
    if (!src) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(1);
    }
    Diag d;
    diag_init(&d, src, stderr);
    Program *p = parse_program(src, &d);
    Model *m = d.errors ? NULL : sema_check(p, &d);
    if (m)
        m = model_build(m, &d);
    if (!m) {
        fprintf(stderr, "%s does not compile\n", path);
        exit(1);
    }
    return m;
}

int unit_report(void)
{
    printf("%d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed != 0;
}
