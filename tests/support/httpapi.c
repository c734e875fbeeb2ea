/* httpapi.c — see httpapi.h. */
#include "httpapi.h"

#include <stdlib.h>
#include <string.h>

#include "harness.h"

long
api_at(const char *base, const char *method, const char *path, const char *json,
       struct hresp *r)
{
    char *u = hfmt("%s%s", base, path);
    long st = http_json(method, u, json, r);
    free(u);
    return st;
}

long
api(const char *method, const char *path, const char *json, struct hresp *r)
{
    return api_at(test_http_url(), method, path, json, r);
}

int
http_port(void)
{
    const char *u = test_http_url();
    return atoi(strrchr(u, ':') + 1);
}

void
hdone(char *id)
{
    struct hresp r;
    apif("DELETE", NULL, &r, "/v1/sandboxes/%s", id);
    hresp_free(&r);
    free(id);
}
