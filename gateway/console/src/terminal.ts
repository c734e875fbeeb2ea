// terminal.ts — a sandbox's terminal: xterm.js over the front's terminal
// WebSocket (GET /v1/sandboxes/{id}/terminal, docs/http.md "Terminal": the
// Cloudflare SDK's PTY protocol — binary frames are bytes both ways, text
// frames JSON control messages).  One shared terminal per session; the
// console uses the session "console".  The terminal fills the window: its
// size (cols x rows of xterm's cells) is sent when it opens (?cols=&rows=)
// and, as {"type":"resize","cols":N,"rows":N}, whenever the window's size
// changes it (the shell inside sees SIGWINCH and `stty size` follows).
// #term's data-cols / data-rows hold the size last sent.
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

  // Fit the terminal to the window: xterm's screen is cols x rows cells, so
  // its rendered size gives a cell's; the room left is the window right and
  // below the box, less the status line under it.
  const fit = () => {
    const screen = box.querySelector('.xterm-screen');
    const r = screen?.getBoundingClientRect();
    if (!r || r.width <= 0 || r.height <= 0) return;
    const cw = r.width / term.cols, ch = r.height / term.rows;
    const top = box.getBoundingClientRect().top + window.scrollY;
    const cols = Math.floor((document.documentElement.clientWidth - r.left - 32) / cw);
    const rows = Math.floor((window.innerHeight - top - 56) / ch);
    const c = Math.max(20, Math.min(cols, 1000)), n = Math.max(5, Math.min(rows, 1000));
    if (c !== term.cols || n !== term.rows) term.resize(c, n);
  };
  const sized = () => {
    box.dataset.cols = String(term.cols);
    box.dataset.rows = String(term.rows);
  };
  let timer: number | undefined;
  const onWindow = () => {
    clearTimeout(timer);
    timer = window.setTimeout(fit, 60);
  };
  window.addEventListener('resize', onWindow);

  (async () => {
    const cred = await wsCredential(id);
    if (closed) return;
    fit();
    sized();
    const q = new URLSearchParams({ session: 'console', cols: String(term.cols), rows: String(term.rows) });
    if (cred) q.set('access_token', cred);
    const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
    ws = new WebSocket(`${scheme}//${location.host}/v1/sandboxes/${id}/terminal?${q}`);
    ws.binaryType = 'arraybuffer';
    ws.onopen = () => { // resized while connecting: tell the server now
      if (box.dataset.cols !== String(term.cols) || box.dataset.rows !== String(term.rows)) {
        ws?.send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
        sized();
      }
    };
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
    if (ws && ws.readyState === WebSocket.OPEN) {
      ws.send(JSON.stringify({ type: 'resize', cols, rows }));
      sized();
    }
  });
  return () => {
    closed = true;
    window.removeEventListener('resize', onWindow);
    clearTimeout(timer);
    if (ws) ws.close();
    term.dispose();
  };
}
