// terminal.ts — a sandbox's terminal: xterm.js over the front's terminal
// WebSocket (GET /v1/sandboxes/{id}/terminal, docs/http.md "Terminal": the
// Cloudflare SDK's PTY protocol — binary frames are bytes both ways, text
// frames JSON control messages).  One shared terminal per session; the
// console uses the session "console".
import { Terminal } from '@xterm/xterm';
import { wsCredential } from './api';
import { banner, el } from './dom';

export function showTerminal(main: HTMLElement, id: string): () => void {
  const box = el('div', { id: 'term' });
  const state = el('p', { class: 'muted', id: 'term-state' }, 'connecting…');
  main.append(box, state);
  const term = new Terminal({ cols: 100, rows: 28, convertEol: false, fontSize: 13 });
  term.open(box);
  let ws: WebSocket | null = null;
  let closed = false;

  (async () => {
    const cred = await wsCredential(id);
    if (closed) return;
    const q = new URLSearchParams({ session: 'console', cols: String(term.cols), rows: String(term.rows) });
    if (cred) q.set('access_token', cred);
    const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
    ws = new WebSocket(`${scheme}//${location.host}/v1/sandboxes/${id}/terminal?${q}`);
    ws.binaryType = 'arraybuffer';
    ws.onmessage = (ev) => {
      if (typeof ev.data !== 'string') {
        term.write(new Uint8Array(ev.data as ArrayBuffer));
        return;
      }
      const m = JSON.parse(ev.data);
      if (m.type === 'ready') {
        state.textContent = 'connected';
        box.dataset.ready = '1';
        term.focus();
      } else if (m.type === 'exit') {
        state.textContent = `the shell exited (${m.code}); reload to start a new one`;
      } else if (m.type === 'error') {
        banner(`${m.code ?? 'ERROR'}: ${m.message}`);
      }
    };
    ws.onclose = () => {
      if (!closed) state.textContent = 'disconnected';
    };
    ws.onerror = () => banner('the terminal connection failed (is the API key right?)');
  })();

  const enc = new TextEncoder();
  term.onData((s) => {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(enc.encode(s));
  });
  term.onResize(({ cols, rows }) => {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols, rows }));
  });
  return () => {
    closed = true;
    if (ws) ws.close();
    term.dispose();
  };
}
