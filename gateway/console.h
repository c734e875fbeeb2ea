/*
 * console.h — the web console's built files, embedded in sbxd.
 *
 * console_assets is generated at build time by tools/build-console.sh from
 * console/ (TypeScript bundled with esbuild, xterm.js's CSS; docs/console.md)
 * into build/console/console_assets.c, which is not in git.  gateway/console.c
 * serves it under /console/ when the front runs with --console.
 */
#ifndef SBX_CONSOLE_H
#define SBX_CONSOLE_H

#include <stddef.h>

/* One built file: its name under /console/ (no slash: "index.html",
 * "app.js", "app.css"), its Content-Type, its bytes (static, read-only,
 * NUL-terminated after len for convenience) and its length in bytes. */
struct console_asset {
    const char *path;
    const char *ctype;
    const unsigned char *data;
    size_t len;
};

/* The files, ended by an entry whose path is NULL. */
extern const struct console_asset console_assets[];

#endif
