// Shared helpers of the web tests: paths from the environment, free ports, child
// processes in their own process groups (killed at the end whatever happens), waiting.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const SOURCE_DIR = path.resolve(here, '..', '..');

export class TestFailure extends Error {}

export function fail(message) {
  throw new TestFailure(message);
}

export function check(cond, message) {
  if (!cond) fail(message);
}

const INSTALL_HINT = 'run scripts/install-deps.sh (it installs Debian chromium and runs npm ci in tests/web)';

// Imports an npm package of tests/web, failing clearly when node_modules is missing.
export async function importPackage(name) {
  try {
    return await import(name);
  } catch (e) {
    fail(`cannot load the npm package '${name}' (${e.code || e.message}): ${INSTALL_HINT}`);
  }
}

export function env() {
  const binDir = process.env.DAISY_BIN_DIR || path.join(SOURCE_DIR, 'build', 'apps', 'cli');
  const bin = path.join(binDir, 'daisychain');
  const models = process.env.DAISY_MODELS || path.join(SOURCE_DIR, 'models');
  const artifacts = process.env.DAISY_ARTIFACT_DIR || path.join(SOURCE_DIR, 'build', 'artifacts');
  const chromium = process.env.DAISY_CHROMIUM || '/usr/bin/chromium';
  return { bin, binDir, models, artifacts, chromium };
}

export function requireFile(file, what, hint) {
  if (!fs.existsSync(file)) fail(`${what} not found at ${file}${hint ? ': ' + hint : ''}`);
}

export function requireChromium(file) {
  requireFile(file, 'chromium', INSTALL_HINT);
}

// A port that was free a moment ago on 127.0.0.1, from below the kernel's ephemeral range:
// a port from listen(0) can go to another socket (the server's internal listeners, a
// client connecting out, even to itself) before the server binds it (see FreePort in
// tests/proc_util.h).
let freePortCalls = 0;
function portGap() {
  let [lo, hi] = [32768, 60999];
  try {
    const f = fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    if (f.length === 2 && f.every(Number.isInteger)) [lo, hi] = f;
  } catch {}
  if (lo - 1 > 10000) return [Math.max(1024, lo - 12000), lo - 1];
  if (hi < 65535) return [hi + 1, 65535];
  return [1024, 65535];
}
function bindsOn(port) {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
}
export async function freePort() {
  const [first, last] = portGap();
  const span = last - first + 1;
  let at = (process.pid * 7919 + Date.now() + freePortCalls++ * 104729) % span;
  for (let tries = 0; tries < 500; ++tries, at = (at + 7919) % span) {
    if (await bindsOn(first + at)) return first + at;
  }
  throw new Error(`no free port between ${first} and ${last}`);
}

export function tempDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const allProcs = [];  // every Procs, for the watchdog

// Children, each the leader of its own process group, with output captured to a log file.
export class Procs {
  constructor(logDir) {
    this.logDir = logDir;
    this.list = [];
    allProcs.push(this);
  }

  start(name, cmd, args, extraEnv = {}) {
    const logFile = path.join(this.logDir, name + '.log');
    const fd = fs.openSync(logFile, 'a');
    fs.writeSync(fd, `$ ${cmd} ${args.join(' ')}\n`);
    const child = spawn(cmd, args, {
      env: { ...process.env, ...extraEnv },
      stdio: ['ignore', fd, fd],
      detached: true,  // its own process group: we kill the whole group
    });
    fs.closeSync(fd);
    const p = { name, child, logFile, exited: false, code: null, signal: null };
    child.on('exit', (code, signal) => {
      p.exited = true;
      p.code = code;
      p.signal = signal;
    });
    child.on('error', (e) => {
      p.exited = true;
      p.error = e;
    });
    this.list.push(p);
    return p;
  }

  log(name) {
    const p = this.list.find((x) => x.name === name);
    if (!p) return '';
    try {
      return fs.readFileSync(p.logFile, 'utf8');
    } catch (_) {
      return '';
    }
  }

  tail(name, lines = 60) {
    const all = this.log(name).split('\n');
    return all.slice(-lines).join('\n');
  }

  // Fails when a process has died.
  checkAlive() {
    for (const p of this.list) {
      if (p.exited) {
        fail(`${p.name} exited early (${p.error ? p.error.message : p.signal ? 'signal ' + p.signal : 'code ' + p.code}); its log ends:\n${this.tail(p.name, 40)}`);
      }
    }
  }

  // SIGTERM to every group, then SIGKILL to what is left after a grace period.
  async stopAll(graceMs = 3000) {
    const alive = () => this.list.filter((p) => !p.exited && p.child.pid);
    for (const p of alive()) {
      try { process.kill(-p.child.pid, 'SIGTERM'); } catch (_) { /* gone */ }
    }
    const until = Date.now() + graceMs;
    while (alive().length && Date.now() < until) await sleep(50);
    for (const p of this.list) {
      if (!p.child.pid) continue;
      // The group may hold children even when the leader is gone.
      try { process.kill(-p.child.pid, 'SIGKILL'); } catch (_) { /* gone */ }
    }
  }
}

// Kills the children if the test runner itself is told to stop.
export function killOnSignals(procs) {
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(sig, () => {
      for (const p of procs.list) {
        try { process.kill(-p.child.pid, 'SIGKILL'); } catch (_) { /* gone */ }
      }
      process.exit(1);
    });
  }
}

export async function waitFor(what, fn, { timeoutMs = 30000, intervalMs = 100, procs } = {}) {
  const until = Date.now() + timeoutMs;
  let last;
  for (;;) {
    if (procs) procs.checkAlive();
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      if (e instanceof TestFailure) throw e;
      last = e;
    }
    if (Date.now() > until) fail(`timed out after ${timeoutMs / 1000} s waiting for ${what}${last ? ' (last error: ' + last.message + ')' : ''}`);
    await sleep(intervalMs);
  }
}

// The host's cookie, for the UI's API (/api/*): serve's admin secret (docs/HTTP.md, "Access").
function hostHeaders(secret) {
  return secret ? { Cookie: `daisy_admin=${secret}` } : {};
}

export async function getJSON(url, secret = '') {
  const res = await fetch(url, { headers: hostHeaders(secret), signal: AbortSignal.timeout(5000) });
  if (!res.ok) throw new Error(`GET ${url}: HTTP ${res.status} ${await res.text()}`);
  return res.json();
}

export async function postJSON(url, body, secret = '') {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...hostHeaders(secret) },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(60000),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
  return { status: res.status, json, text };
}

// Waits until `serve` (started with --admin-secret-file secretFile) has written its admin
// secret and answers GET /api/state with it; returns the secret.
export async function waitForServe(base, procs, secretFile, timeoutMs = 30000) {
  const secret = await waitFor(`serve to write its admin secret to ${secretFile}`, () => {
    try {
      return fs.readFileSync(secretFile, 'utf8').trim() || null;
    } catch (_) {
      return null;
    }
  }, { timeoutMs, procs, intervalMs: 100 });
  await waitFor(`${base}/api/state to answer`, () => getJSON(`${base}/api/state`, secret), { timeoutMs, procs, intervalMs: 200 });
  return secret;
}

// ---------- what several web tests start the same way ----------

// `daisychain ARGS` run to its end (60 s at most): its stdout and stderr. Fails on a non-zero exit.
export function cli(E, args, extraEnv = {}) {
  const r = spawnSync(E.bin, args, { encoding: 'utf8', timeout: 60000, env: { ...process.env, ...extraEnv } });
  if (r.status !== 0) fail(`${E.bin} ${args.join(' ')} exited with ${r.status}: ${r.stderr}`);
  return (r.stdout || '') + (r.stderr || '');
}

// The last JSON object in a command's output (`--json` prints it on lines of its own).
export function lastJson(log) {
  const at = log.lastIndexOf('\n{');
  if (at < 0) fail('the head printed no JSON:\n' + log.slice(-3000));
  return JSON.parse(log.slice(at + 1));
}

// The probe hash the native binary prints (`generate --verbose` on stories260K).
export function nativeProbeHash(E, extraEnv = {}) {
  const out = cli(E, ['generate', '--model', path.join(E.models, 'stories260K'), '--prompt', 'x', '-n', '1',
    '--verbose'], extraEnv);
  const m = /^probe hash: ([0-9a-f]{16})$/m.exec(out);
  if (!m) fail(`no probe hash from ${E.bin} generate --verbose`);
  return m[1];
}

// The test Hub server (tools/testhub.cc), failing clearly when it is not built.
export function testhubPath(E) {
  const testhub = path.resolve(E.binDir, '..', '..', 'tests', 'support', 'testhub');
  requireFile(testhub, 'the test Hub server', 'build it first (cmake --build build --target testhub)');
  return testhub;
}

// Starts the test Hub serving `root` on a free port (`args`: --gate, --token, ...); resolves
// its URL once a GET of `probe` (a path on it) answers `status`.
export async function startTestHub(procs, E, root, args, { probe, status }) {
  const port = await freePort();
  const hub = `http://127.0.0.1:${port}`;
  procs.start('testhub', testhubPath(E), ['--root', root, '--port', String(port), ...args]);
  await waitFor('the test Hub', async () => (await fetch(hub + probe)).status === status, { procs });
  return hub;
}

// Starts `daisychain serve --port PORT ARGS` with an admin secret file under `tmp`, and waits
// until its API answers. `port`: one from freePort() (a room name may be made from it).
export async function startServe(procs, E, tmp, { port, args, env: extraEnv = {} }) {
  const secretFile = path.join(tmp, 'admin-secret');
  procs.start('serve', E.bin, ['serve', '--port', String(port), ...args, '--admin-secret-file', secretFile], extraEnv);
  const base = `http://127.0.0.1:${port}`;
  const secret = await waitForServe(base, procs, secretFile);
  return { base, secret, join: `127.0.0.1:${port}` };
}

// Headless Debian chromium as every browser test runs it.
export function launchChromium(chromium, E) {
  return chromium.launch({
    executablePath: E.chromium,
    args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-dev-shm-usage'],
  });
}

// A device in serve's room list that takes part: approved and not gone.
export const inRoom = (d) => !!d && d.status !== 'pending' && d.status !== 'gone';

// Polls serve's device list (GET /api/state) until `pick(devices)` gives a value, and returns it.
export function waitForDevices(base, secret, what, pick, { procs, timeoutMs = 30000 } = {}) {
  return waitFor(what, async () => pick((await getJSON(`${base}/api/state`, secret)).devices), { procs, timeoutMs });
}

// Waits for a child that is meant to end (a head's run); returns its log and stops watching it.
export async function ended(procs, p, timeoutMs = 120000) {
  await waitFor(`${p.name} to end`, () => p.exited, { timeoutMs });
  const log = procs.log(p.name);
  procs.list.splice(procs.list.indexOf(p), 1);  // ended as it should: no longer watched
  return log;
}

// The start of a browser test: its scratch folder, its children (stopped on a signal too)
// and the page errors it collects; finish() ends them.
export function testScope(prefix) {
  const tmp = tempDir(prefix);
  const procs = new Procs(tmp);
  killOnSignals(procs);
  return { tmp, procs, pageErrors: [] };
}

// A page's uncaught errors, kept for the end of the test (a test fails when any were seen).
export function collectErrors(page, pageErrors) {
  page.on('pageerror', (e) => pageErrors.push(String(e && e.stack ? e.stack : e)));
}

// The UI signed in as the admin: the one-time link, then the clean URL it redirects to.
export async function signIn(page, base, secret) {
  await page.goto(`${base}/?token=${secret}`);
  await page.waitForURL(base + '/', { timeout: 15000 });
}

// The end of a test, whatever happened: the browser closed, the children stopped; on a
// failure their logs' tails and the page errors printed and `tmp` kept, else removed.
// `logsTo`: also copy each child's whole log to `${logsTo}-<name>.log` (a test's artifacts).
export async function finish({ browser, procs, tmp, ok, pageErrors = [], logsTo = '' }) {
  if (browser) await browser.close().catch(() => {});
  await procs.stopAll();
  if (logsTo) {
    for (const p of procs.list) {
      try { fs.copyFileSync(p.logFile, `${logsTo}-${p.name}.log`); } catch (_) { /* none */ }
    }
  }
  if (!ok) {
    for (const p of procs.list) console.error(`---- ${p.name} log (tail) ----\n${procs.tail(p.name, 40)}`);
    if (pageErrors.length) console.error('---- page errors ----\n' + pageErrors.join('\n'));
    console.error(`logs kept in ${tmp}`);
  } else {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

// Runs main(); prints a clear failure and sets a non-zero exit code. A watchdog ends a
// test that hangs (before CTest's own timeout) with the logs and every child killed.
export async function runTest(name, main, { watchdogS = 160 } = {}) {
  const t0 = Date.now();
  const watchdog = setTimeout(() => {
    console.error(`FAIL ${name}: still running after ${watchdogS} s (hung?)`);
    for (const procs of allProcs) {
      for (const p of procs.list) {
        console.error(`---- ${p.name} log (tail) ----\n${procs.tail(p.name, 40)}`);
        try { process.kill(-p.child.pid, 'SIGKILL'); } catch (_) { /* gone */ }
      }
      console.error(`logs kept in ${procs.logDir}`);
    }
    process.exit(1);
  }, watchdogS * 1000);
  watchdog.unref();
  try {
    await main();
    console.log(`PASS ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
    process.exitCode = 0;
  } catch (e) {
    console.error(`FAIL ${name}: ${e instanceof TestFailure ? e.message : e && e.stack ? e.stack : e}`);
    process.exitCode = 1;
  } finally {
    clearTimeout(watchdog);
  }
}
