// code.ts — code cells: context.run (Python, JavaScript or TypeScript, in
// the language's default context) and its outputs: printed text, the
// error's traceback, and rich results — text, PNG/JPEG as images, SVG as an
// image (so its scripts never run), HTML in an iframe with an empty
// `sandbox` attribute: an opaque origin with scripts off, never a page of
// the console's origin (which holds the API key).
import { op } from './api';
import { el, errText } from './dom';

function renderResult(r: any): Node {
  if (r.png) return el('img', { alt: 'PNG output', class: 'png', src: `data:image/png;base64,${r.png}` });
  if (r.jpeg) return el('img', { alt: 'JPEG output', src: `data:image/jpeg;base64,${r.jpeg}` });
  if (r.svg) return el('img', { alt: 'SVG output', src: `data:image/svg+xml;charset=utf-8,${encodeURIComponent(r.svg)}` });
  if (r.html) {
    const f = el('iframe', { sandbox: true, class: 'html', title: 'HTML output' });
    f.srcdoc = r.html;
    return f;
  }
  if (r.json !== undefined) return el('pre', {}, JSON.stringify(r.json, null, 2));
  return el('pre', {}, r.text ?? r.markdown ?? r.latex ?? '');
}

export function showCode(main: HTMLElement, id: string): () => void {
  const lang = el('select', { id: 'code-lang' }, ...['python', 'javascript', 'typescript']
    .map((l) => el('option', { value: l }, l)));
  const src = el('textarea', { id: 'code-src', spellcheck: 'false' });
  src.value = 'import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()';
  const out = el('div', { class: 'out', id: 'code-out' });
  const run = el('button', { id: 'code-run' }, 'Run');

  run.addEventListener('click', async () => {
    run.disabled = true;
    out.replaceChildren(el('p', { class: 'muted' }, 'running…'));
    try {
      const r = await op(id, 'context.run', { code: src.value, language: lang.value });
      const parts: Node[] = [];
      for (const s of r.logs?.stdout ?? []) parts.push(el('pre', { class: 'stdout' }, s));
      for (const s of r.logs?.stderr ?? []) parts.push(el('pre', { class: 'stderr' }, s));
      for (const res of r.results ?? []) parts.push(renderResult(res));
      if (r.error) parts.push(el('pre', { class: 'stderr' },
        `${r.error.name}: ${r.error.value}\n${(r.error.traceback ?? []).join('\n')}`));
      parts.push(el('p', { class: 'muted' }, `[${r.executionCount ?? ''}] ${r.duration ?? '?'} ms`));
      out.replaceChildren(...parts);
      out.dataset.done = '1';
    } catch (e) {
      out.replaceChildren(el('pre', { class: 'stderr' }, errText(e)));
    } finally {
      run.disabled = false;
    }
  });
  main.append(el('div', { class: 'row' }, 'Language ', lang, run), src, el('div', { class: 'cell' }, out));
  return () => {};
}
