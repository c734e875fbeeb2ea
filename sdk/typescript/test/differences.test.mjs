// Keeps docs/protocol.md §7 ("Where sbx differs from the Cloudflare Sandbox
// SDK, and why") honest. Each row of that table has an entry here, found by
// the start of the row's first cell: a `check` that asserts sbx still
// behaves as the row says (so a difference that is no longer true fails),
// and/or `covered`, tests elsewhere that assert it (their names must still
// exist). A row without an entry, or an entry without a row, fails too.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';

import { ProcessError, SandboxError, ValidationFailedError } from '../dist/index.js';
import { packageDir, useDaemon } from './helpers.mjs';

const ctx = useDaemon();
const repo = path.resolve(packageDir, '../..');

const differences = [
  {
    row: 'A session command that times out is killed',
    check: async (sb) => {
      const s = await sb.createSession({ id: 'to' });
      await s.exec('cd /tmp && KEEP=7');
      const r = await s.exec('sleep 30', { timeout: 500 });
      assert.equal(r.exitCode, 124);
      assert.equal((await s.exec('echo "$KEEP $(pwd)"')).stdout, '7 /tmp\n');
    },
  },
  {
    row: '`exec` takes an `argv`',
    check: async (sb) => {
      assert.equal((await sb.exec(['printf', '%s|', 'a b', '$HOME'])).stdout, 'a b|$HOME|');
      assert.equal((await sb.exec('cat', { stdin: 'fed' })).stdout, 'fed');
    },
  },
  {
    row: 'Results carry `cause`',
    check: async (sb) => {
      assert.equal((await sb.exec('exit 3', { sessionless: true })).cause, 'EXITED');
      assert.equal((await sb.exec('sleep 30', { timeout: 300 })).cause, 'TIMEOUT');
    },
  },
  {
    row: "The request's deadline reaches the agent",
    covered: ['tests/integration/test_exec.c: a_command_ends_at_the_request_deadline_and_the_session_goes_on'],
  },
  {
    row: 'Streams have sequence numbers',
    covered: ['sdk/typescript/test/exec.test.mjs: resumes with Last-Event-ID after the connection drops mid-stream'],
  },
  {
    row: 'Process logs are a ring of the newest 2 MiB',
    covered: ['tests/integration/test_lifecycle.c: a_log_reader_behind_the_ring_is_told_how_many_events_it_missed'],
  },
  {
    row: 'A background process that cannot start leaves no entry',
    check: async (sb) => {
      await assert.rejects(sb.startProcess('true', { processId: 'never', cwd: '/does/not/exist' }), (err) => {
        assert.ok(err instanceof ValidationFailedError || err instanceof ProcessError, String(err));
        return true;
      });
      assert.ok(!(await sb.listProcesses()).some((p) => p.id === 'never'));
    },
  },
  {
    row: '`runCode` output streams as the cell produces it',
    covered: ['tests/integration/test_interp.c: timeout_interrupts_and_the_context_survives'],
  },
  {
    row: 'Replies have caps',
    covered: ['tests/integration/test_exec.c: a_result_too_large_for_a_reply_is_an_error_not_a_restart'],
  },
  {
    row: '`COMMAND_NOT_FOUND`, `PORT_NOT_EXPOSED`, `WATCH_NOT_FOUND` are reserved',
    check: async (sb) => {
      assert.equal((await sb.exec('no-such-command-19')).exitCode, 127);
      await sb.unexposePort(9999); // not exposed: no error
    },
  },
  {
    row: 'Arguments are checked strictly',
    check: async (sb) => {
      await assert.rejects(sb.call('file.write', { path: '/tmp/strict', content: 'a', append: 'yes' }), ValidationFailedError);
    },
  },
  {
    row: 'Cluster faults have codes of their own',
    covered: ['tests/integration/test_daemon.c: a_dead_or_stopped_shard_gives_shard_unavailable_in_time'],
  },
  {
    row: 'Authorization is deployment-wide',
    covered: ['tests/integration/test_http.c: keyless_front_refuses_cross_origin_and_foreign_hosts'],
  },
  {
    row: 'What survives `sleepAfter`',
    covered: ['tests/integration/test_watch_git_env.c: variables_survive_a_container_restart_by_sleep_after'],
  },
  {
    row: '`exposePort(3000)` works',
    check: async (sb) => {
      assert.equal((await sb.exposePort(3000)).port, 3000);
    },
  },
  {
    row: 'Observing is not activity',
    covered: [
      'sdk/typescript/test/dropin.test.mjs: polling status and lists does not keep a sandbox awake',
      'tests/integration/test_lifecycle.c: observing_is_not_activity',
    ],
  },
  {
    row: '`checkChanges` resync reasons',
    check: async (sb) => {
      // Any directory, not only /workspace.
      assert.equal((await sb.checkChanges('/tmp')).status, 'unchanged');
    },
    covered: ['sdk/typescript/test/dropin.test.mjs: checkChanges: unchanged, changed, resync and malformed since'],
  },
  {
    row: 'The hosts refused with `CUSTOM_DOMAIN_REQUIRED` are a deployment option',
    covered: [
      'sdk/typescript/test/dropin.test.mjs: exposePort with a workers.dev hostname throws CustomDomainRequiredError',
      'tests/integration/test_preview.c: port_3000_is_exposable_and_workers_dev_needs_a_custom_domain',
      'tests/integration/test_deploy.c: no_preview_host_replaces_the_refused_preview_hosts',
    ],
  },
];

/** The first cells of the rows of §7's table. */
function section7Rows() {
  const doc = readFileSync(path.join(repo, 'docs/protocol.md'), 'utf8');
  const start = doc.indexOf('\n## 7.');
  assert.ok(start >= 0, 'docs/protocol.md has no section 7');
  const next = doc.indexOf('\n## ', start + 5);
  const lines = doc.slice(start, next < 0 ? undefined : next).split('\n');
  return lines
    .filter((l) => l.startsWith('| ') && !l.startsWith('| sbx |') && !l.startsWith('|---'))
    .map((l) => l.slice(2).split(' | ')[0]);
}

describe('docs/protocol.md §7 is honest', () => {
  it('every row has a check or a covering test, and every entry a row', () => {
    const rows = section7Rows();
    for (const r of rows) {
      const d = differences.filter((x) => r.startsWith(x.row));
      assert.equal(d.length, 1, `§7 row without exactly one entry here: "${r.slice(0, 80)}…"`);
    }
    for (const d of differences) {
      assert.ok(rows.some((r) => r.startsWith(d.row)), `entry without a §7 row: "${d.row}"`);
      assert.ok(d.check || d.covered, d.row);
      for (const c of d.covered ?? []) {
        const file = c.slice(0, c.indexOf(': '));
        const name = c.slice(c.indexOf(': ') + 2);
        const text = readFileSync(path.join(repo, file), 'utf8');
        const found = file.endsWith('.c')
          ? new RegExp(`Test\\(\\w+, ${name}[,)]`).test(text)
          : text.includes(`it('${name}'`);
        assert.ok(found, `${d.row}: ${file} has no test "${name}"`);
      }
    }
  });

  for (const d of differences.filter((x) => x.check)) {
    it(`still true: ${d.row}`, async () => {
      const sb = ctx.sandbox('diff');
      try {
        await d.check(sb);
      } catch (err) {
        if (err instanceof SandboxError) err.message += ` (${err.code})`;
        throw err;
      }
    });
  }
});
