// processes.ts — background processes: process.list, start one
// (process.start with a shell string), kill it, and follow its logs live:
// the stream proc:<id> read as Server-Sent Events (docs/http.md) with fetch,
// so the key stays a header.
import { op, request, sse } from './api';
import { banner, el, errText } from './dom';

export function showProcesses(main: HTMLElement, id: string): () => void {
  const rows = el('tbody', { id: 'proc-rows' });
  const cmd = el('input', { id: 'proc-cmd', placeholder: 'a shell command, e.g. python3 -m http.server 8000', size: '60' });
  const logs = el('pre', { id: 'proc-logs' });
  const title = el('h2', {}, 'Logs');
  let follow: AbortController | null = null;

  async function list(): Promise<void> {
    try {
      const r = await op(id, 'process.list');
      rows.replaceChildren(...(r.processes ?? []).map((p: any) => el('tr', { 'data-id': p.id },
        el('td', {}, p.id), el('td', {}, p.status), el('td', {}, p.exitCode != null ? String(p.exitCode) : ''),
        el('td', {}, el('code', {}, p.command)),
        el('td', {}, el('button', { class: 'logs', onclick: () => watch(p.id) }, 'Logs'), ' ',
          p.status === 'running' || p.status === 'starting'
            ? el('button', { class: 'kill', onclick: () => kill(p.id) }, 'Kill') : ''))));
    } catch (e) {
      banner(errText(e));
    }
  }

  async function kill(pid: string): Promise<void> {
    try {
      await request('DELETE', `/v1/sandboxes/${id}/processes/${encodeURIComponent(pid)}`);
    } catch (e) {
      banner(errText(e));
    }
    await list();
  }

  function watch(pid: string): void {
    if (follow) follow.abort();
    follow = new AbortController();
    logs.replaceChildren();
    title.textContent = `Logs of ${pid}`;
    const sig = follow.signal;
    sse(`/v1/sandboxes/${id}/streams/proc:${encodeURIComponent(pid)}`, (ev) => {
      if ((ev.type === 'stdout' || ev.type === 'stderr') && typeof ev.data === 'string') {
        logs.append(ev.type === 'stderr' ? el('span', { class: 'error' }, ev.data) : ev.data);
      } else if (ev.type === 'exit' || ev.type === 'complete') {
        logs.append(el('span', { class: 'muted' }, `\n[exited ${ev.exitCode ?? ev.code ?? ''}]\n`));
        list();
      } else if (ev.type === 'gap') {
        logs.append(el('span', { class: 'muted' }, `\n[${ev.missed} events skipped]\n`));
      }
    }, sig).catch((e) => {
      if (!sig.aborted) banner(errText(e));
    });
  }

  const form = el('form', {
    class: 'row', id: 'proc-form',
    onsubmit: async (ev: Event) => {
      ev.preventDefault();
      if (!cmd.value.trim()) return;
      try {
        const r = await op(id, 'process.start', { command: cmd.value });
        cmd.value = '';
        await list();
        watch(r.processId);
      } catch (e) {
        banner(errText(e));
      }
    },
  }, cmd, el('button', { type: 'submit' }, 'Start'), el('button', { type: 'button', onclick: () => list() }, 'Refresh'));

  main.append(form, el('table', { id: 'processes' }, el('thead', {}, el('tr', {},
    ...['ID', 'Status', 'Exit', 'Command', ''].map((t) => el('th', {}, t)))), rows), title, logs);
  list();
  return () => {
    if (follow) follow.abort();
  };
}
