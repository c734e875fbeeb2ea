// files.ts — the file browser: file.list of a directory, click a directory
// to enter it, download a file (GET …/files/{path}: the bytes, fetched with
// the key as a header and saved from a blob) and upload files into the
// directory (PUT …/files/{path}, at most 29 MiB each).
import { fileUrl, op, request } from './api';
import { banner, bytes, el, errText } from './dom';

export function showFiles(main: HTMLElement, id: string): () => void {
  let dir = '/workspace';
  const where = el('code', { id: 'cwd' });
  const rows = el('tbody', { id: 'file-rows' });
  const upload = el('input', { type: 'file', id: 'upload', multiple: true });

  async function list(): Promise<void> {
    where.textContent = dir;
    try {
      const r = await op(id, 'file.list', { path: dir, includeHidden: true });
      const files = (r.files ?? []).sort((a: any, b: any) =>
        (a.type === 'directory' ? 0 : 1) - (b.type === 'directory' ? 0 : 1) || a.name.localeCompare(b.name));
      const up = dir === '/' ? [] : [el('tr', {}, el('td', {}, el('a', {
        href: '#', onclick: (ev: Event) => { ev.preventDefault(); dir = dir.replace(/\/[^/]+$/, '') || '/'; list(); },
      }, '..')), el('td', {}), el('td', {}), el('td', {}))];
      rows.replaceChildren(...up, ...files.map((f: any) => el('tr', { 'data-name': f.name },
        el('td', {}, f.type === 'directory'
          ? el('a', { href: '#', onclick: (ev: Event) => { ev.preventDefault(); dir = f.absolutePath; list(); } }, f.name + '/')
          : f.name),
        el('td', {}, f.type === 'directory' ? '' : bytes(f.size)),
        el('td', {}, f.modifiedAt ?? ''),
        el('td', {}, f.type === 'file'
          ? el('button', { class: 'download', onclick: () => download(f.absolutePath, f.name) }, 'Download')
          : ''))));
    } catch (e) {
      rows.replaceChildren();
      banner(errText(e));
    }
  }

  async function download(path: string, name: string): Promise<void> {
    try {
      const blob = await (await request('GET', fileUrl(id, path))).blob();
      const url = URL.createObjectURL(blob);
      const a = el('a', { href: url, download: name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) {
      banner(errText(e));
    }
  }

  upload.addEventListener('change', async () => {
    for (const f of Array.from(upload.files ?? [])) {
      try {
        await request('PUT', fileUrl(id, `${dir}/${f.name}`), f, { 'Content-Type': 'application/octet-stream' });
      } catch (e) {
        banner(`${f.name}: ${errText(e)}`);
      }
    }
    upload.value = '';
    await list();
  });

  main.append(el('div', { class: 'row' }, 'Directory ', where,
    el('label', {}, ' Upload ', upload),
    el('button', { onclick: () => list() }, 'Refresh')),
  el('table', { id: 'files' }, el('thead', {}, el('tr', {}, ...['Name', 'Size', 'Modified', '']
    .map((t) => el('th', {}, t)))), rows));
  list();
  return () => {};
}
