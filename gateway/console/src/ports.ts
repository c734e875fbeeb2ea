// ports.ts — preview links: the ports exposed for the sandbox's container
// (port.list) as links that open in a new tab with no opener and no
// referrer (a preview page is tenant content), exposing a port
// (port.expose) and withdrawing one (DELETE …/ports/{port}).
import { op, request } from './api';
import { banner, el, errText } from './dom';

export function showPorts(main: HTMLElement, id: string): () => void {
  const rows = el('tbody', { id: 'port-rows' });
  const port = el('input', { id: 'port-num', type: 'number', min: '1024', max: '65535', placeholder: 'port' });

  async function list(): Promise<void> {
    try {
      const r = await op(id, 'port.list');
      rows.replaceChildren(...(r.ports ?? []).map((p: any) => el('tr', { 'data-port': String(p.port) },
        el('td', {}, String(p.port)), el('td', {}, p.name ?? ''),
        el('td', {}, el('a', { href: p.url, target: '_blank', rel: 'noopener noreferrer', class: 'preview' }, p.url)),
        el('td', {}, el('button', {
          onclick: async () => {
            try {
              await request('DELETE', `/v1/sandboxes/${id}/ports/${p.port}`);
            } catch (e) {
              banner(errText(e));
            }
            await list();
          },
        }, 'Unexpose')))));
    } catch (e) {
      banner(errText(e));
    }
  }

  const form = el('form', {
    class: 'row', id: 'port-form',
    onsubmit: async (ev: Event) => {
      ev.preventDefault();
      try {
        await op(id, 'port.expose', { port: Number(port.value) });
        port.value = '';
      } catch (e) {
        banner(errText(e));
      }
      await list();
    },
  }, port, el('button', { type: 'submit' }, 'Expose'));
  main.append(form, el('table', { id: 'ports' }, el('thead', {}, el('tr', {},
    ...['Port', 'Name', 'Preview URL', ''].map((t) => el('th', {}, t)))), rows));
  list();
  return () => {};
}
