// main.ts — the console's shell: the key form and the pages, routed by the
// URL's fragment (#/ the sandboxes; #/sb/<id>/<tab> one sandbox's page), so
// the gateway serves one document and nothing of a page's state is sent to
// the server.  docs/console.md describes the pages.
import { getKey, setKey } from './api';
import { banner } from './dom';
import { showSandboxes } from './sandboxes';
import { showSandbox } from './sandbox';

let leave: (() => void) | null = null; // the current page's clean-up (sockets, streams)

function route(): void {
  if (leave) leave();
  leave = null;
  banner(null);
  const main = document.getElementById('main')!;
  main.replaceChildren();
  const m = location.hash.match(/^#\/sb\/([a-z0-9-]{1,63})(?:\/([a-z]+))?$/);
  if (m) leave = showSandbox(main, m[1], m[2] ?? 'terminal');
  else leave = showSandboxes(main);
}

function init(): void {
  const key = document.getElementById('key') as HTMLInputElement;
  key.value = getKey();
  document.getElementById('keyform')!.addEventListener('submit', (ev) => {
    ev.preventDefault();
    setKey(key.value.trim());
    route();
  });
  document.getElementById('forget')!.addEventListener('click', () => {
    key.value = '';
    setKey('');
    route();
  });
  window.addEventListener('hashchange', route);
  route();
}

init();
