// sandboxes.ts — the list page: every sandbox of the deployment (`list`)
// with its state and resource use, create (PUT /v1/sandboxes/{id}) and
// destroy (DELETE).  Refreshed every 3 s while shown.
import { ApiError, globalOp, request } from './api';
import { banner, bytes, el, errText } from './dom';

export function showSandboxes(main: HTMLElement): () => void {
  const body = el('tbody', { id: 'sandbox-rows' });
  const status = el('p', { class: 'muted', id: 'list-status' }, 'Loading…');
  const name = el('input', { id: 'new-id', placeholder: 'new sandbox ID ([a-z0-9-])', pattern: '[a-z0-9-]{1,63}' });
  let stopped = false;

  async function refresh(): Promise<void> {
    try {
      const r = await globalOp('list');
      if (stopped) return;
      body.replaceChildren(...(r.sandboxes ?? []).sort((a: any, b: any) => a.id.localeCompare(b.id))
        .map(row));
      status.textContent = `${r.count ?? r.sandboxes.length} sandbox(es)`;
    } catch (e) {
      if (stopped) return;
      body.replaceChildren();
      status.textContent = e instanceof ApiError && e.status === 401
        ? 'Enter an API key above to see the sandboxes.' : errText(e);
    }
  }

  function row(s: any): HTMLTableRowElement {
    const c = s.container ?? {};
    const destroy = el('button', {
      class: 'destroy', 'data-id': s.id,
      onclick: async () => {
        if (!confirm(`Destroy ${s.id}?`)) return;
        try {
          await request('DELETE', `/v1/sandboxes/${s.id}`);
        } catch (e) {
          banner(errText(e));
        }
        await refresh();
      },
    }, 'Destroy');
    return el('tr', { 'data-id': s.id },
      el('td', {}, el('a', { href: `#/sb/${s.id}/terminal` }, s.id)),
      el('td', { class: `state state-${s.state}` }, s.state),
      el('td', {}, bytes(c.memoryBytes)),
      el('td', {}, c.cpuUsageUs != null ? `${(c.cpuUsageUs / 1e6).toFixed(2)} s` : ''),
      el('td', {}, c.pids != null ? String(c.pids) : ''),
      el('td', {}, s.shard ?? ''),
      el('td', {}, s.createdAt ? new Date(s.createdAt).toLocaleString() : ''),
      el('td', {}, destroy));
  }

  const form = el('form', {
    class: 'row', id: 'create-form',
    onsubmit: async (ev: Event) => {
      ev.preventDefault();
      const id = name.value.trim();
      if (!id) return;
      try {
        await request('PUT', `/v1/sandboxes/${encodeURIComponent(id)}`, '{}',
                      { 'Content-Type': 'application/json' });
        name.value = '';
        banner(null);
      } catch (e) {
        banner(errText(e));
      }
      await refresh();
    },
  }, name, el('button', { type: 'submit', id: 'create' }, 'Create'));

  main.append(el('h1', {}, 'Sandboxes'), form,
    el('table', { id: 'sandboxes' },
      el('thead', {}, el('tr', {}, ...['ID', 'State', 'Memory', 'CPU', 'Processes', 'Shard', 'Created', '']
        .map((t) => el('th', {}, t)))),
      body),
    status);
  refresh();
  const timer = setInterval(refresh, 3000);
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}
