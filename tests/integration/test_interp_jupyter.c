/*
 * test_interp_jupyter.c — differential test: for each Python snippet, the
 * outputs sbx's code interpreter returns carry the same MIME types, in the
 * same order and of the same kind (main result or display), as what a real
 * Jupyter kernel (Debian's python3-ipykernel, driven through
 * python3-jupyter-client by tests/support/jupyter_oracle.py) returns for it;
 * the same streams receive text; the same exception name is raised.
 *
 * The snippets run in order in one kernel and in one sbx context, so state
 * carries over identically.  Two behaviours differ by design and are left
 * out (docs/protocol.md §3.7, "Where Python contexts differ from a Jupyter
 * kernel"): output a subprocess writes to fd 1 (`os.system`) reaches sbx
 * through its own pipe, so its order against print() output is not kept
 * (ipykernel 6 forwards it through the cell's stdout stream); and a figure
 * without axes is not displayed.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../support/harness.h"
#include "../support/sdk.h"

static const char *const SNIPPETS[] = {
    "1+1",
    "x = 5",
    "x;",
    "print(\"hello\"); x * 2",
    "import sys; print(\"out\"); print(\"err\", file=sys.stderr); \"done\"",
    "print(\"a\"); 1/0",
    "def f(:\n    pass",
    "undefined_name",
    "raise KeyError(\"k\")",
    "display(42); display(\"a\", \"b\")",
    "from IPython.display import HTML, Markdown, Latex, JSON, SVG, Javascript, Image, display\n"
    "HTML(\"<b>hi</b>\")",
    "Markdown(\"# T\")",
    "display(Latex(\"$x^2$\"), JSON({\"a\": [1, 2]}))",
    "SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"4\" height=\"4\">"
    "<rect width=\"4\" height=\"4\"/></svg>')",
    "import base64\nImage(data=base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAAD"
    "UlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='))",
    "Javascript(\"console.log(1)\")",
    "class R:\n    def _repr_html_(self): return \"<i>r</i>\"\n"
    "    def _repr_markdown_(self): return None\n"
    "    def _repr_latex_(self): return (\"$r$\", {\"k\": 1})\nR()",
    "class M:\n    def _repr_mimebundle_(self, include=None, exclude=None):\n"
    "        return {\"text/plain\": \"M\", \"application/vnd.x+json\": {\"v\": 1}}\n"
    "    def _repr_html_(self): return \"<p>m</p>\"\nM()",
    "class P:\n    def _repr_png_(self):\n        return base64.b64decode('iVBORw0KGgoAAAANSUhEUgA"
    "AAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==')\nP()",
    "class J:\n    def _repr_json_(self): return {\"k\": [1, 2]}\nJ()",
    "int",
    "{\"a\": 1, \"b\": [1, 2, 3]}",
    "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])",
    "plt.plot([1, 2]); plt.title(\"t\"); plt.show(); print(\"after\")",
    "fig, ax = plt.subplots(1, 2); ax[0].plot([1]);",
    "import pandas as pd\ndf = pd.DataFrame({\"a\": [1, 2], \"b\": [3.5, 4.5]})\ndf",
    "display(df.head(1)); df.describe()",
    "df[\"a\"]",
    "import numpy as np\nnp.arange(5)",
    "import asyncio\nawait asyncio.sleep(0.01)\n\"awaited\"",
    "import warnings; warnings.warn(\"careful\")",
    "print(\"no newline\", end=\"\")",
    "[print(i) for i in range(3)]",
    "h = display(\"a\", display_id=\"x\"); h.update(\"b\")",
    "%time 1+1",
};
#define NSNIP (sizeof(SNIPPETS) / sizeof(SNIPPETS[0]))

/* What the oracle prints for every snippet (see jupyter_oracle.py). */
static json_t *
jupyter_answers(void)
{
    char path[] = "/tmp/sbx-jupyter-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    json_t *list = json_array();
    for (size_t i = 0; i < NSNIP; i++)
        json_array_append_new(list, json_string(SNIPPETS[i]));
    char *text = json_dumps(list, 0);
    json_decref(list);
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
    free(text);

    const char *src = getenv("SBX_SRC") ? getenv("SBX_SRC") : ".";
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/tests/support/jupyter_oracle.py %s", src,
             path);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run the Jupyter oracle");
    json_error_t je;
    json_t *out = json_loadf(p, 0, &je);
    int st = pclose(p);
    unlink(path);
    cr_assert(out && st == 0, "the Jupyter oracle failed (status %d): %s", st,
              out ? "" : je.text);
    cr_assert(json_is_array(out) && json_array_size(out) == NSNIP);
    return out;
}

/* Sort an array of strings in place (insertion sort: a handful of items). */
static void
sort_strings(json_t *a)
{
    size_t n = json_array_size(a);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            json_t *x = json_array_get(a, j - 1), *y = json_array_get(a, j);
            if (strcmp(json_string_value(x), json_string_value(y)) <= 0)
                break;
            json_incref(x);
            json_array_set(a, j - 1, y);
            json_array_set_new(a, j, x);
        }
}

/* One sbx reply in the oracle's shape. */
static json_t *
sbx_answer(json_t *res)
{
    json_t *outputs = json_array();
    json_t *r;
    size_t i;
    json_array_foreach(json_object_get(res, "results"), i, r) {
        json_t *mimes = json_copy(json_object_get(r, "formats"));
        sort_strings(mimes);
        json_array_append_new(
            outputs, json_pack("[s,o]", json_is_true(json_object_get(r, "isMainResult"))
                                            ? "execute_result"
                                            : "display_data",
                               mimes));
    }
    json_t *streams = json_array();
    const char *names[] = {"stderr", "stdout"};
    for (int k = 0; k < 2; k++) {
        json_t *logs = jget(res, k ? "logs.stdout" : "logs.stderr");
        size_t n = 0;
        json_t *s;
        json_array_foreach(logs, i, s) n += strlen(json_string_value(s) ? json_string_value(s) : "");
        if (n)
            json_array_append_new(streams, json_string(names[k]));
    }
    json_t *err = jget(res, "error.name");
    return json_pack("{s:o,s:o,s:O}", "outputs", outputs, "streams", streams, "error",
                     err ? err : json_null());
}

Test(interp_jupyter, mime_types_match_a_real_jupyter_kernel, .timeout = 300)
{
    json_t *want = jupyter_answers();
    sbx_client *c = test_client();
    char *id = test_id("jupyter");
    tcall t = tc_call(c, "context.create", id, json_pack("{s:s}", "language", "python"), 120000);
    tc_ok(t, "context.create");
    char ctx[128];
    snprintf(ctx, sizeof(ctx), "%s", jstr(t.res, "contextId"));
    tc_free(&t);

    size_t same = 0;
    for (size_t i = 0; i < NSNIP; i++) {
        t = tc_call(c, "context.run", id,
                    json_pack("{s:s,s:s}", "code", SNIPPETS[i], "context", ctx), 120000);
        tc_ok(t, "context.run");
        json_t *got = sbx_answer(t.res);
        json_t *exp = json_array_get(want, i);
        /* The kernel's reply status is not part of sbx's shape: an error is. */
        json_t *cmp = json_pack("{s:O,s:O,s:O}", "outputs", json_object_get(exp, "outputs"),
                                "streams", json_object_get(exp, "streams"), "error",
                                json_object_get(exp, "error"));
        char *gs = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
        char *es = json_dumps(cmp, JSON_COMPACT | JSON_SORT_KEYS);
        bool eq = json_equal(got, cmp);
        same += eq;
        cr_expect(eq, "snippet %zu differs from Jupyter:\n  code:    %s\n  jupyter: %s\n  sbx:     %s",
                  i, SNIPPETS[i], es, gs);
        free(gs);
        free(es);
        json_decref(got);
        json_decref(cmp);
        tc_free(&t);
    }
    cr_log_info("%zu of %zu snippets give Jupyter's MIME types", same, NSNIP);
    cr_expect_geq(NSNIP, 20);
    json_decref(want);
    tdone(c, id);
    sbx_client_close(c);
}
