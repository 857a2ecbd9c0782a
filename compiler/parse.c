/*
 * parse.c — runs the flex scanner and bison parser (grammar/) over one
 * source held in memory and returns its AST.
 */
#include "fsdpc.h"
#include "parser.h"
#include "lexer.h"

#include <string.h>

/* Brackets and operator chains deeper than this are refused: far beyond
 * any real model, and small enough for every recursive pass's stack. */
enum { MAX_NESTING = 256 };

Program *parse_program(Source *src, Diag *d)
{
    /* A NUL byte means binary data or UTF-16 text, not a .fsd file: one
     * message for it rather than one per stray byte. */
    const char *nul = memchr(src->text, 0, src->len);
    if (nul) {
        uint32_t at = (uint32_t)(nul - src->text);
        diag_error(d, (Loc){at, at + 1}, "NUL byte: this is not a text file; .fsd files are "
                                         "ASCII or UTF-8 text");
        return ast_program(src, NULL);
    }
    ParseCtx ctx = {.src = src, .diag = d, .max_depth = MAX_NESTING};
    ctx.opens = arena_alloc(sizeof(Loc) * MAX_NESTING);
    yyscan_t scanner;
    if (yylex_init_extra(&ctx, &scanner))
        fsd_panic(__FILE__, __LINE__, "cannot start the scanner");
    YY_BUFFER_STATE buf = yy_scan_bytes(src->text, (int)src->len, scanner);
    yyparse(scanner, &ctx);
    yy_delete_buffer(buf, scanner);
    yylex_destroy(scanner);
    if (!ctx.prog)
        ctx.prog = ast_program(src, NULL);
    return ctx.prog;
}
