/*
 * files_mime.c — the MIME type of a file for file.read and file.readStream:
 * by extension (the table the SDK gets from Bun), then sniffed from its
 * first bytes, with the decision whether it is text (valid UTF-8 without
 * NUL) or binary.  Pure: no I/O, no state; called by files_rw.c.
 */
#include "files_int.h"
/* ------------------------------------------------------------------------------ */
/* MIME types: by extension (the table the SDK gets from Bun), then sniffed. */

static const struct {
    const char *ext, *mime;
} mimes[] = {
    {"txt", "text/plain"}, {"md", "text/markdown"}, {"html", "text/html"}, {"htm", "text/html"},
    {"css", "text/css"}, {"csv", "text/csv"}, {"tsv", "text/tab-separated-values"},
    {"js", "text/javascript"}, {"mjs", "text/javascript"}, {"cjs", "text/javascript"},
    {"ts", "text/x-typescript"}, {"tsx", "text/x-typescript"}, {"jsx", "text/javascript"},
    {"json", "application/json"}, {"xml", "application/xml"}, {"yaml", "application/yaml"},
    {"yml", "application/yaml"}, {"toml", "application/toml"}, {"py", "text/x-python"},
    {"sh", "application/x-sh"}, {"c", "text/x-c"}, {"h", "text/x-c"}, {"cpp", "text/x-c++"},
    {"rs", "text/x-rust"}, {"go", "text/x-go"}, {"java", "text/x-java"}, {"rb", "text/x-ruby"},
    {"svg", "image/svg+xml"}, {"png", "image/png"}, {"jpg", "image/jpeg"}, {"jpeg", "image/jpeg"},
    {"gif", "image/gif"}, {"webp", "image/webp"}, {"ico", "image/x-icon"}, {"bmp", "image/bmp"},
    {"pdf", "application/pdf"}, {"zip", "application/zip"}, {"gz", "application/gzip"},
    {"tar", "application/x-tar"}, {"wasm", "application/wasm"}, {"mp3", "audio/mpeg"},
    {"wav", "audio/wav"}, {"mp4", "video/mp4"}, {"webm", "video/webm"}, {"woff", "font/woff"},
    {"woff2", "font/woff2"}, {"ttf", "font/ttf"}, {"ipynb", "application/x-ipynb+json"},
    {"log", "text/plain"}, {"ini", "text/plain"}, {"cfg", "text/plain"}, {"conf", "text/plain"},
};

static bool
valid_utf8(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c == 0)
            return false;
        size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
                             : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!k || (k > 1 && c < 0xc2) || i + k > n) {
            /* A truncated sequence at the end of a sample is fine. */
            return k && i + k > n && n >= 4096;
        }
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xc0) != 0x80)
                return false;
        i += k;
    }
    return true;
}

const char *
files_mime_of(const char *path, const unsigned char *head, size_t n, bool *binary)
{
    *binary = !valid_utf8(head, n);
    if (n >= 8 && !memcmp(head, "\x89PNG\r\n\x1a\n", 8))
        return "image/png";
    if (n >= 3 && !memcmp(head, "\xff\xd8\xff", 3))
        return "image/jpeg";
    if (n >= 4 && !memcmp(head, "GIF8", 4))
        return "image/gif";
    if (n >= 4 && !memcmp(head, "%PDF", 4))
        return "application/pdf";
    if (n >= 4 && !memcmp(head, "PK\x03\x04", 4))
        return "application/zip";
    if (n >= 2 && !memcmp(head, "\x1f\x8b", 2))
        return "application/gzip";
    if (n >= 4 && !memcmp(head, "\x7f" "ELF", 4))
        return "application/x-executable";
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    if (dot && (!slash || dot > slash)) {
        for (size_t i = 0; i < SBX_ARRAY_LEN(mimes); i++)
            if (!strcasecmp(dot + 1, mimes[i].ext))
                return mimes[i].mime;
    }
    return *binary ? "application/octet-stream" : "text/plain";
}
