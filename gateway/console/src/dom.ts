// dom.ts — small helpers to build the console's DOM.  Text is always set as
// text (textContent), never parsed as HTML: sandbox names, file names and
// outputs are tenant data.

type Attrs = Record<string, string | boolean | ((ev: any) => void)>;

export function el<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {},
    ...kids: (Node | string | null | undefined)[]): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (typeof v === 'function') e.addEventListener(k.replace(/^on/, ''), v);
    else if (v === true) e.setAttribute(k, '');
    else if (v !== false) e.setAttribute(k, v);
  }
  for (const kid of kids) {
    if (kid == null) continue;
    e.append(typeof kid === 'string' ? document.createTextNode(kid) : kid);
  }
  return e;
}

export function bytes(n: number | undefined): string {
  if (n == null) return '';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) {
    n /= 1024;
    i++;
  }
  return `${i ? n.toFixed(1) : n} ${u[i]}`;
}

/** Show an error (or clear it with null) in the banner. */
export function banner(msg: string | null): void {
  const b = document.getElementById('banner')!;
  b.textContent = msg ?? '';
  b.hidden = !msg;
}

export function errText(e: unknown): string {
  const a = e as { code?: string; message?: string };
  return a.code ? `${a.code}: ${a.message}` : String(e);
}
