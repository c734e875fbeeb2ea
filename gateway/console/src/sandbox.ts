// sandbox.ts — one sandbox's page: its status line and tabs (terminal,
// files, processes, code, preview links); each tab is its own module and
// returns its clean-up.
import { ApiError, request } from './api';
import { bytes, el, errText } from './dom';
import { showTerminal } from './terminal';
import { showFiles } from './files';
import { showProcesses } from './processes';
import { showCode } from './code';
import { showPorts } from './ports';

const TABS: Record<string, (main: HTMLElement, id: string) => () => void> = {
  terminal: showTerminal,
  files: showFiles,
  processes: showProcesses,
  code: showCode,
  ports: showPorts,
};

export function showSandbox(main: HTMLElement, id: string, tab: string): () => void {
  const show = TABS[tab] ?? showTerminal;
  const info = el('p', { class: 'muted', id: 'sb-status' });
  main.append(el('h1', {}, el('a', { href: '#/' }, 'Sandboxes'), ' / ', id), info,
    el('nav', { class: 'tabs' }, ...Object.keys(TABS).map((t) =>
      el('a', { href: `#/sb/${id}/${t}`, class: t === tab ? 'on' : '' }, t))));
  const status = () => request('GET', `/v1/sandboxes/${id}`).then((r) => r.json()).then((r) => {
    const s = r.sandbox, c = s.container ?? {};
    info.textContent = `${s.state}` + (c.memoryBytes != null ? ` · memory ${bytes(c.memoryBytes)}` : '') +
      (c.pids != null ? ` · ${c.pids} processes` : '') + (s.shard ? ` · shard ${s.shard}` : '');
  }).catch((e) => {
    info.textContent = e instanceof ApiError && e.code === 'SANDBOX_NOT_FOUND'
      ? 'not created yet: its first operation creates it' : errText(e);
  });
  status();
  const timer = setInterval(status, 3000);
  const page = el('section', { id: `page-${tab}` });
  main.append(page);
  const leave = show(page, id);
  return () => {
    clearInterval(timer);
    leave();
  };
}

