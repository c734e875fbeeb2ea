/*
 * console.c — the web console's files on the HTTP front (docs/console.md):
 *
 *   GET|HEAD /console            308 to /console/
 *   GET|HEAD /console/           index.html
 *   GET|HEAD /console/<file>     app.js, app.css (console_assets, console.h)
 *
 * only when the front runs with --console (conf.console); otherwise these
 * paths are the API's 404.  The files need no key: they hold no data, and
 * every call the page makes goes through the API with the key the user
 * types (kept in the tab's sessionStorage, sent as Authorization: Bearer).
 * Keyless, the browser guard has already run (a loopback Host only).
 *
 * Every answer carries a strict Content-Security-Policy: scripts only from
 * the console's own files (no inline script, no eval), connections only to
 * its own origin (API, SSE, terminal WebSocket), images from itself and
 * data: URLs (PNG outputs), no plugins, no framing of the console by other
 * pages (frame-ancestors), no <base>, no form posts.  Styles allow
 * 'unsafe-inline' because xterm.js's DOM renderer writes <style> elements;
 * styles run no code.  HTML outputs of code cells are shown in iframes with
 * an empty sandbox attribute (opaque origin, scripts off; console/src/code.ts).
 * Runs on MHD's threads; reads only static data and h->conf.
 */
#include <string.h>

#include "console.h"
#include "http_int.h"

#define CONSOLE_CSP                                                                                \
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "                    \
    "img-src 'self' data: blob:; connect-src 'self'; frame-src 'self'; font-src 'self'; "          \
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

bool
console_match(const struct sbx_http *h, const char *url)
{
    return h->conf.console && !strncmp(url, "/console", 8) && (url[8] == '\0' || url[8] == '/');
}

static enum MHD_Result
queue_static(struct MHD_Connection *c, unsigned status, const char *ctype, const void *data,
             size_t len, const char *location)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    MHD_add_response_header(r, "Content-Security-Policy", CONSOLE_CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    if (location)
        MHD_add_response_header(r, "Location", location);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result
console_access(struct sbx_http *h, struct MHD_Connection *c, const char *url, const char *method)
{
    (void)h;
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        if (!r)
            return MHD_NO;
        MHD_add_response_header(r, "Allow", "GET, HEAD");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_METHOD_NOT_ALLOWED, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (!strcmp(url, "/console"))
        return queue_static(c, MHD_HTTP_PERMANENT_REDIRECT, "text/plain; charset=utf-8", "", 0,
                            "/console/");
    const char *name = url + 9; /* after "/console/" */
    if (!*name)
        name = "index.html";
    for (const struct console_asset *a = console_assets; a->path; a++)
        if (!strcmp(a->path, name))
            return queue_static(c, MHD_HTTP_OK, a->ctype, a->data, a->len, NULL);
    return http_queue_error(c, MHD_HTTP_NOT_FOUND, "ROUTE_NOT_FOUND",
                            "no such file of the console (see /console/)");
}
