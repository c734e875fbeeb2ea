/*
 * interp_result.c — result shaping of code runs: the text a runCode keeps of
 * a cell's stdout/stderr (struct logacc), rich outputs (display_data,
 * execute_result) turned into the SDK's Result shape with charts, and the
 * error fields, all within the caps of one reply frame (interp_int.h,
 * RUN_LOG_CAP and after).  Called by interp_driver.c as events arrive and by
 * interp.c when a run ends; pure encoding, no I/O.  One loop thread.
 */
#include "interp_int.h"

/* ------------------------------------------------------------------------------ */
/* Text of the cell's logs. */

void
interp_logacc_init(struct logacc *l, size_t cap)
{
    memset(l, 0, sizeof(*l));
    sbx_buf_init(&l->text);
    l->cap = cap;
}

static void
logacc_free(struct logacc *l)
{
    sbx_buf_free(&l->text);
    free(l->lens);
    l->lens = NULL;
    l->n = l->alloc = 0;
}

/* Keep what fits of one chunk (valid UTF-8); past RUN_LOG_ENTRIES chunks the
 * text joins the last chunk, so the entry count stays bounded. */
void
interp_logacc_add(struct logacc *l, const char *p, size_t n)
{
    l->total += n;
    if (n > l->cap - l->text.len) {
        l->truncated = true;
        n = sbx_utf8_complete_prefix(p, l->cap - l->text.len);
    }
    if (!n)
        return;
    sbx_buf_append(&l->text, p, n);
    if (l->n == RUN_LOG_ENTRIES) {
        l->lens[l->n - 1] += (uint32_t)n;
        return;
    }
    if (l->n == l->alloc) {
        l->alloc = l->alloc ? l->alloc * 2 : 64;
        l->lens = sbx_xrealloc(l->lens, l->alloc * sizeof(*l->lens));
    }
    l->lens[l->n++] = (uint32_t)n;
}

/* The chunks as an array of strings; the storage is freed as it goes (the
 * reply is being built: do not hold the text twice). */
void
interp_logacc_encode(sbx_enc *e, struct logacc *l)
{
    sbx_enc_array(e);
    size_t off = 0;
    for (size_t i = 0; i < l->n; i++) {
        sbx_enc_strn(e, l->text.p + off, l->lens[i]);
        off += l->lens[i];
    }
    sbx_enc_end(e);
    sbx_buf_free(&l->text);
}

/* ------------------------------------------------------------------------------ */
/* Results in the SDK's shape. */

static const struct {
    const char *mime, *field;
} mime_fields[] = {
    {"text/plain", "text"},        {"text/html", "html"},       {"image/png", "png"},
    {"image/jpeg", "jpeg"},        {"image/svg+xml", "svg"},    {"text/latex", "latex"},
    {"text/markdown", "markdown"}, {"application/javascript", "javascript"},
    {"application/json", "json"},
};

/* Whether a JSON value may go into a reply (JSON_MAX_DEPTH levels,
 * JSON_MAX_VALUES values); *count grows by its values. */
static bool
json_fits(const json_t *v, int depth, size_t *count)
{
    if (depth > JSON_MAX_DEPTH || ++*count > JSON_MAX_VALUES)
        return false;
    if (json_is_real(v) && !isfinite(json_real_value(v)))
        return false; /* msgpack has them, JSON clients do not */
    size_t i;
    const char *k;
    json_t *x;
    if (json_is_array(v)) {
        json_array_foreach(v, i, x)
            if (!json_fits(x, depth + 1, count))
                return false;
    } else if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, x) {
            ++*count; /* the key */
            if (!json_fits(x, depth + 1, count))
                return false;
        }
    }
    return true;
}

/* A JSON object's string member, or its {text} member's (Plotly and Vega
 * titles are either). */
static json_t *
title_of(json_t *v)
{
    if (json_is_object(v))
        v = json_object_get(v, "text");
    return json_is_string(v) ? v : NULL;
}

/*
 * The SDK's ChartData from a bundle's chart format, as the Cloudflare
 * container derives it: Plotly (application/vnd.plotly.v1+json) →
 * {type from the first trace, title, data: traces, layout, config, library:
 * "plotly"}; Vega-Lite (v4, v5) → {type from the mark, title, data: the
 * spec, library: "altair"}.  A new reference, or NULL.  (matplotlib figures
 * get theirs from the Python driver, which has the figure itself.)
 */
static json_t *
chart_from_bundle(json_t *data)
{
    json_t *chart = NULL, *v;
    const char *type = "unknown";
    if ((v = json_object_get(data, "application/vnd.plotly.v1+json")) && json_is_object(v)) {
        json_t *traces = json_object_get(v, "data"), *layout = json_object_get(v, "layout");
        json_t *t0 = json_array_get(traces, 0);
        if (json_is_object(t0)) {
            /* Plotly's defaults: a trace without type is a scatter, one
             * without mode draws lines. */
            const char *tt = json_string_value(json_object_get(t0, "type"));
            const char *mode = json_string_value(json_object_get(t0, "mode"));
            tt = tt ? tt : "scatter";
            if (!strcmp(tt, "scatter") || !strcmp(tt, "scattergl"))
                type = !mode || strstr(mode, "lines") ? "line" : "scatter";
            else if (!strcmp(tt, "bar") || !strcmp(tt, "pie") || !strcmp(tt, "histogram") ||
                     !strcmp(tt, "heatmap"))
                type = tt;
        }
        chart = json_pack("{s:s, s:o, s:o, s:s}", "type", type, "data",
                          traces ? json_incref(traces) : json_null(), "layout",
                          json_is_object(layout) ? json_incref(layout) : json_object(), "library",
                          "plotly");
        json_t *title = title_of(json_object_get(layout, "title"));
        if (chart && title)
            json_object_set(chart, "title", title);
        if (chart && (v = json_object_get(v, "config")))
            json_object_set(chart, "config", v);
        return chart;
    }
    static const char *const vl[] = {"application/vnd.vegalite.v5+json",
                                     "application/vnd.vegalite.v4+json"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(vl) && !chart; i++) {
        if (!(v = json_object_get(data, vl[i])) || !json_is_object(v))
            continue;
        json_t *mark = json_object_get(v, "mark");
        const char *m = json_string_value(json_is_object(mark) ? json_object_get(mark, "type") : mark);
        static const struct {
            const char *mark, *type;
        } marks[] = {{"line", "line"},       {"bar", "bar"},   {"point", "scatter"},
                     {"circle", "scatter"},  {"square", "scatter"}, {"arc", "pie"},
                     {"rect", "heatmap"}};
        for (size_t k = 0; m && k < SBX_ARRAY_LEN(marks); k++)
            if (!strcmp(m, marks[k].mark))
                type = marks[k].type;
        chart = json_pack("{s:s, s:O, s:s}", "type", type, "data", v, "library", "altair");
        json_t *title = title_of(json_object_get(v, "title"));
        if (chart && title)
            json_object_set(chart, "title", title);
    }
    return chart;
}

/*
 * Encode one result map from a Jupyter data bundle (and the driver's chart,
 * if any, else one derived from the bundle); returns the msgpack objects
 * written.  A JSON value that does not
 * fit a reply is left out and the result marked `truncated`.  A `standin`
 * carries only the first STANDIN_TEXT bytes of its text, its formats and
 * `truncated: true`: what is left of a result the run had no room for.
 */
size_t
interp_encode_result(sbx_enc *e, json_t *data, json_t *chart, bool main_result, bool standin)
{
    size_t objs = 1;
    bool cut = standin;
    const char *k;
    json_t *v;
    sbx_enc_map(e);
    for (size_t i = 0; i < SBX_ARRAY_LEN(mime_fields); i++) {
        v = json_object_get(data, mime_fields[i].mime);
        if (!v || (standin && i > 0))
            continue;
        size_t n = 0;
        if (json_is_string(v)) {
            size_t len = json_string_length(v);
            if (standin && len > STANDIN_TEXT)
                len = sbx_utf8_complete_prefix(json_string_value(v), STANDIN_TEXT);
            sbx_enc_kstrn(e, mime_fields[i].field, json_string_value(v), len);
            n = 1;
        } else if (json_fits(v, 0, &n)) {
            sbx_enc_str(e, mime_fields[i].field);
            sbx_json_to_msgpack(v, e); /* cannot fail: json_fits checked */
        } else {
            cut = true;
            continue;
        }
        objs += 1 + n;
    }
    size_t n = 0;
    json_t *derived = chart || standin ? NULL : chart_from_bundle(data);
    chart = chart ? chart : derived;
    if (chart && !standin) {
        if (json_is_object(chart) && json_fits(chart, 0, &n)) {
            sbx_enc_str(e, "chart");
            sbx_json_to_msgpack(chart, e);
            objs += 1 + n;
        } else {
            cut = true;
        }
    }
    json_decref(derived);
    sbx_enc_karray(e, "formats");
    json_object_foreach(data, k, v) {
        sbx_enc_str(e, k);
        objs++;
    }
    sbx_enc_end(e);
    sbx_enc_kbool(e, "isMainResult", main_result);
    objs += 4;
    if (cut) {
        sbx_enc_kbool(e, "truncated", true);
        objs += 2;
    }
    sbx_enc_end(e);
    return objs;
}

/* A result of a non-streamed run, within the run's budgets. */
void
interp_run_add_result(struct run *r, json_t *data, json_t *chart, bool main_result)
{
    size_t room = RUN_RESULTS_CAP - SBX_MIN(r->results.len, RUN_RESULTS_CAP);
    if (!main_result)
        room = room > RUN_MAIN_RESERVE ? room - RUN_MAIN_RESERVE : 0;
    size_t oroom = RUN_OBJECTS_CAP - SBX_MIN(r->res_objects, RUN_OBJECTS_CAP);
    sbx_enc one;
    size_t objs = 0;
    bool ok = false;
    for (int standin = 0; standin < 2 && !ok; standin++) {
        if (standin)
            r->res_truncated = true;
        if (r->nresults >= RUN_RESULTS_MAX)
            break;
        sbx_enc_init(&one);
        objs = interp_encode_result(&one, data, chart, main_result, standin);
        ok = !one.bad && one.len <= room && objs <= oroom;
        if (!ok)
            sbx_enc_free(&one);
    }
    if (!ok)
        return;
    char *b;
    size_t bl;
    if (sbx_enc_finish(&one, &b, &bl) == 0) {
        sbx_enc_raw(&r->results, b, bl);
        free(b);
        r->nresults++;
        r->res_objects += objs;
    }
}

/* The error fields {name, value, traceback} into the open map e, each cut
 * to its cap (a traceback is cut at whole lines, the last one saying so). */
void
interp_encode_error_fields(sbx_enc *e, const char *name, json_t *value, json_t *tb)
{
    sbx_enc_kstr(e, "name", name && *name ? name : "Error");
    const char *vs = json_string_value(value);
    size_t vl = vs ? json_string_length(value) : 0;
    if (vl > ERROR_VALUE_CAP)
        vl = sbx_utf8_complete_prefix(vs, ERROR_VALUE_CAP);
    sbx_enc_kstrn(e, "value", vs ? vs : "", vl);
    sbx_enc_karray(e, "traceback");
    size_t i, used = 0, lines = 0, n = json_array_size(tb);
    json_t *line;
    json_array_foreach(tb, i, line) {
        if (!json_is_string(line))
            continue;
        size_t ll = json_string_length(line);
        if (lines == ERROR_TB_LINES || used + ll > ERROR_TB_CAP) {
            char note[80];
            snprintf(note, sizeof(note), "[sbx: %zu more traceback lines not kept]", n - i);
            sbx_enc_str(e, note);
            break;
        }
        sbx_enc_strn(e, json_string_value(line), ll);
        used += ll;
        lines++;
    }
    sbx_enc_end(e);
}

void
interp_run_free(struct run *r)
{
    sbx_enc_free(&r->results);
    logacc_free(&r->logs[0]);
    logacc_free(&r->logs[1]);
    sbx_enc_free(&r->error);
    free(r->payload);
    free(r);
}
