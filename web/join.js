// The join page (GET /join): this browser tab asks to join serve's room and, once the host
// approves its key, holds layers in the ring. Plain JS, nothing fetched from elsewhere.
//
// The main thread holds the page and the WebSocket link to serve (ws(s)://HOST/api/link,
// docs/WIRE.md "link"); the Web Worker (tab_worker.js) holds the wasm module: the key pair's
// crypto, the ring member, its downloads and its compute. The link's bytes only pass through
// here, both ways, untouched: the handshake and every envelope are made and opened in the
// worker. Text from the server or the worker goes into the DOM through textContent only.
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const kKeyStore = 'daisy_tab_key_v1';  // {"public_key", "secret_key"} (Z85) for this origin
  const kNameStore = 'daisy_tab_name';
  const kAskedStore = 'daisy_tab_asked';  // "room|server fingerprint" this device asked to join
  const kPollMs = 2000;
  const kPollLimitMs = 30 * 60 * 1000;  // a request nobody approves for 30 min: stop asking
  const kLinkRetries = 20;

  const st = {
    key: null,        // GET /api/key
    me: null,         // {public_key, secret_key, id, fingerprint}
    worker: null,
    ws: null,
    joined: false,    // the host approved this key
    started: false,   // the ring member runs in the worker
    leaving: false,   // the page goes away: the link closes for good
    away: false,      // hidden (the screen is off): out of the room, the link kept
    linkTries: 0,
    tokenHeld: false,
  };

  // ---------- small helpers ----------

  function setText(id, text) { $(id).textContent = text == null ? '' : String(text); }

  function setMsg(id, text) {
    const n = $(id);
    n.textContent = text || '';
    n.hidden = !text;
  }

  function log(line, kind) {
    const li = document.createElement('li');
    if (kind) li.className = 'st-' + kind;
    const ts = document.createElement('span');
    ts.className = 'ts';
    ts.textContent = new Date().toLocaleTimeString() + ' ';
    const text = document.createElement('span');
    text.className = 'line';
    text.textContent = line;
    li.append(ts, text);
    const list = $('log');
    list.append(li);
    while (list.children.length > 200) list.firstChild.remove();
    list.scrollTop = list.scrollHeight;
  }

  function fatal(text) {
    setMsg('fatal', text);
    $('join-btn').disabled = true;
    log(text, 'error');
  }

  function fmtBytes(n) {
    if (typeof n !== 'number' || !isFinite(n) || n < 0) return '—';
    const units = ['B', 'KB', 'MB', 'GB'];
    let i = 0;
    let v = n;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(v) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)) + ' ' + units[i];
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  async function errorText(res) {
    const body = await res.text().catch(() => '');
    try {
      const j = JSON.parse(body);
      if (j && j.error && j.error.message) return 'HTTP ' + res.status + ': ' + j.error.message;
    } catch (_) { /* not JSON */ }
    return 'HTTP ' + res.status + (body ? ': ' + body.slice(0, 300) : '');
  }

  function store(key, value) {
    try {
      if (value === null) localStorage.removeItem(key);
      else localStorage.setItem(key, value);
      return true;
    } catch (_) {
      return false;  // storage disabled (a private window in some browsers)
    }
  }
  function load(key) {
    try { return localStorage.getItem(key); } catch (_) { return null; }
  }

  // ---------- plain HTTP or HTTPS: what it means here ----------

  function transportNote() {
    const local = ['localhost', '127.0.0.1', '[::1]'].includes(location.hostname);
    let text = '';
    if (location.protocol === 'https:') {
      const hub = st.key && st.key.hub_endpoint;
      if (hub && hub.startsWith('http:'))
        text = 'This page came over HTTPS, but serve\'s Hub endpoint (' + hub + ') is plain HTTP: the browser ' +
          'blocks those downloads, so this tab cannot fetch its layers. Give serve an https:// HF_ENDPOINT.';
    } else if (!local) {
      text = 'This page came over plain HTTP. That is fine for joining: the link to serve is encrypted and ' +
        'authenticated by this page\'s own code (keys made here, boxes in WebAssembly), and it needs no ' +
        'browser features that plain HTTP withholds. But anyone on this network could alter the page itself ' +
        'on its way here: join on a network you trust, and check both fingerprints with the host. Serving ' +
        'over HTTPS (a reverse proxy) removes that risk.';
    }
    setMsg('transport-note', text);
  }

  // ---------- the worker ----------

  // Posts a message; byte buffers are transferred, not copied.
  function post(msg, transfer) { if (st.worker) st.worker.postMessage(msg, transfer || []); }

  function startWorker() {
    let w;
    try {
      w = new Worker('/tab_worker.js');
    } catch (e) {
      fatal('This browser cannot start a Web Worker here (' + (e && e.message ? e.message : e) + ').');
      return;
    }
    st.worker = w;
    w.onmessage = (ev) => onWorker(ev.data);
    w.onerror = (ev) => {
      fatal('The browser node stopped: ' + (ev && ev.message ? ev.message : 'an error in its worker') + '.');
      if (ev && ev.preventDefault) ev.preventDefault();
    };
    post({ type: 'init' });
  }

  function onWorker(m) {
    if (!m || typeof m !== 'object') return;
    switch (m.type) {
      case 'engine':
        setText('backend', m.backend || '—');
        setText('probe', m.probe_hash ? m.probe_hash + ' (not compared yet)' : '—');
        if (!m.member) post({ type: 'keys', saved: savedKeys() });  // the ring member's hello: no new keys
        break;
      case 'keys':
        onKeys(m);
        break;
      case 'send':
        if (st.ws && st.ws.readyState === WebSocket.OPEN) st.ws.send(m.data);
        break;
      case 'event':
        onEvent(m.event || {});
        break;
      case 'started':
        st.started = true;
        openLink();
        break;
      case 'left':
        if (st.leaving) closeLink(1000, 'the tab left the room');
        break;
      case 'token':
        showToken(m.held);
        break;
      case 'close':
        closeLink(m.code, m.reason);
        break;
      case 'fatal':
        fatal(m.message);
        break;
      default:
        break;
    }
  }

  function savedKeys() {
    try {
      return JSON.parse(load(kKeyStore) || 'null');
    } catch (_) {
      return null;  // damaged: the worker makes a new pair
    }
  }

  function onKeys(m) {
    st.me = m;
    if (!store(kKeyStore, JSON.stringify({ public_key: m.public_key, secret_key: m.secret_key })))
      log('This browser keeps nothing for this page (storage is off): a reload makes a new key.', 'warn');
    setText('my-fpr', m.fingerprint);
    $('my-fpr').dataset.id = m.id;
    $('join-btn').disabled = !st.key;
    if (st.key && load(kAskedStore) === askedTag()) join();
  }

  // ---------- events of the ring member (the worker's module) ----------

  function onEvent(e) {
    switch (e.kind) {
      case 'status':
        if ((e.state === 'linked' || e.state === 'in_room') && !st.away) setLink('up', 'linked');
        log(e.line, e.level);
        break;
      case 'slice': {
        const n = (e.end || 0) - (e.first || 0);
        setText('slice', n > 0 ? `${e.first}–${e.end - 1} (${n} layers) of ${e.model || 'the model'}` +
          (e.bytes ? ', ' + fmtBytes(e.bytes) : '') : 'none in this plan');
        break;
      }
      case 'progress': {
        $('download').hidden = false;
        const bar = $('download-bar');
        bar.max = Math.max(1, e.total || 0);
        bar.value = Math.min(e.done || 0, bar.max);
        setText('download-nums', fmtBytes(e.done) + ' / ' + fmtBytes(e.total));
        $('download').classList.toggle('complete', e.total > 0 && e.done >= e.total);
        break;
      }
      case 'probe':
        setText('probe', e.state === 'ok' ? e.hash + ' = the ring\'s' : e.state === 'differs'
          ? e.hash + ' differs from the ring\'s ' + (e.ring_hash || '') + ': left out of plans' : e.hash || '—');
        $('probe').dataset.state = e.state || 'unknown';
        break;
      case 'text':
        showText(e);
        break;
      case 'budget':
        setText('budget', fmtBytes(e.bytes));
        $('budget').dataset.bytes = String(e.bytes);
        break;
      case 'hub_unauthorized': {
        // The token field only now: the Hub refused this tab's read. 401 without a token: the
        // repo is gated or private; 403, or 401 with one: the token given was refused.
        $('token-card').hidden = false;
        $('token-form').hidden = false;
        $('token-held').hidden = true;
        const what = e.repo || 'this model';
        const refused = e.status === 403 || e.token_held;
        setMsg('work-error', refused
          ? `The Hub refused the token given here (HTTP ${e.status}): it has no access to ${what}. Give another ` +
            'token below (one from an account that accepted the model\'s terms), then run the turn again.'
          : `The Hub refused ${what} without a token (HTTP ${e.status}: a gated or private repo): give one below, ` +
            'then run the turn again.');
        $('work-error').dataset.status = String(e.status);
        break;
      }
      case 'error':
        setMsg('work-error', e.message);
        log(e.message, 'error');
        break;
      default:
        break;
    }
  }

  // The room's turns, as the ring member receives them (the "text" message of docs/WIRE.md).
  const turns = new Map();
  function showText(e) {
    const key = (e.head_id || '') + '/' + e.stream;
    let t = turns.get(key);
    if (!t) {
      const box = document.createElement('div');
      box.className = 'room-turn';
      box.dataset.testid = 'room-turn';
      const who = document.createElement('div');
      who.className = 'who';
      const pre = document.createElement('pre');
      box.append(who, pre);
      $('stream').prepend(box);
      $('stream-empty').hidden = true;
      t = { box, who, pre, pieces: [] };
      turns.set(key, t);
      while ($('stream').children.length > 20) {
        const last = $('stream').lastChild;
        for (const [k, v] of turns) if (v.box === last) turns.delete(k);
        last.remove();
      }
    }
    if (e.part === 'piece') t.pieces[e.index] = e.text;
    if (e.part === 'retract') t.pieces.length = Math.max(0, e.index);
    t.pre.textContent = t.pieces.join('');
    t.box.dataset.state = e.part === 'end' ? 'done' : e.part === 'failed' ? 'failed' : 'streaming';
    t.who.textContent = (e.head || 'a head') + (e.part === 'failed' ? ' · failed: ' + (e.text || '') : '');
  }

  // ---------- joining: ask, wait for the host, then link ----------

  function askedTag() { return st.key.room + '|' + st.key.fingerprint; }

  function setJoinStatus(state, text) {
    const n = $('join-status');
    n.dataset.state = state;
    n.textContent = text;
  }

  async function join() {
    if (!st.me || !st.key || st.joined) return;
    $('join-btn').disabled = true;
    const name = $('name-input').value.trim().slice(0, 64);
    store(kNameStore, name);
    store(kAskedStore, askedTag());
    const until = Date.now() + kPollLimitMs;
    let announced = false;
    while (!st.joined && Date.now() < until) {
      let res;
      try {
        res = await fetch('/api/join', {
          method: 'POST',
          headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ room: st.key.room, public_key: st.me.public_key, name }),
        });
      } catch (e) {
        setJoinStatus('error', 'Cannot reach serve (' + (e && e.message ? e.message : e) + '); trying again…');
        await sleep(kPollMs * 2);
        continue;
      }
      if (res.status === 429) {
        setJoinStatus('error', (await errorText(res)) + ' — waiting before asking again.');
        await sleep(1000 * Math.max(2, Number(res.headers.get('Retry-After')) || 10));
        continue;
      }
      if (!res.ok) {
        setJoinStatus('error', 'serve refused the join request: ' + (await errorText(res)));
        $('join-btn').disabled = false;
        return;
      }
      const a = await res.json();
      if (a.status === 'approved') {
        st.joined = true;
        setJoinStatus('approved', 'Approved: this device is a member of room ' + st.key.room + '.');
        $('join-form').hidden = true;
        log('the host approved ' + st.me.fingerprint);
        startMember();
        return;
      }
      if (!announced) {
        log('asked to join room ' + st.key.room + ' as ' + st.me.fingerprint);
        announced = true;
      }
      setJoinStatus('pending', 'Waiting for the host to approve ' + st.me.fingerprint + '…');
      await sleep(kPollMs);
    }
    if (!st.joined) {
      setJoinStatus('error', 'Nobody approved this device for 30 minutes: press Join to ask again.');
      $('join-btn').disabled = false;
    }
  }

  // What the browser says this device has (navigator.deviceMemory, GiB, rounded down; Chromium
  // only), or 0 when it does not say. The worker caps the budget by it and by wasm32's 4 GiB.
  function deviceBytes() {
    const gib = Number(navigator.deviceMemory);
    return gib > 0 && isFinite(gib) ? gib * 1024 * 1024 * 1024 : 0;
  }

  // Once approved: the worker starts the ring member and answers 'started'; then the link.
  let starting = false;
  function startMember() {
    if (st.started) return openLink();
    if (starting) return;
    starting = true;
    post({
      type: 'start',
      secret_key: st.me.secret_key,
      server_key: st.key.public_key,
      room: st.key.room,
      name: $('name-input').value.trim(),
      hub_endpoint: st.key.hub_endpoint || '',
      device_bytes: deviceBytes(),
    });
  }

  // ---------- the link: bytes between the WebSocket and the worker ----------

  function setLink(state, text) {
    const n = $('link-state');
    n.dataset.state = state;
    n.textContent = text;
  }

  function openLink() {
    if (st.leaving || st.away || (st.ws && st.ws.readyState <= WebSocket.OPEN)) return;
    const url = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/api/link';
    let ws;
    try {
      ws = new WebSocket(url);
    } catch (e) {
      setLink('down', 'no link');
      log('cannot open ' + url + ': ' + (e && e.message ? e.message : e), 'error');
      return;
    }
    ws.binaryType = 'arraybuffer';
    st.ws = ws;
    setLink('connecting', 'linking…');
    ws.onopen = () => {
      st.linkTries = 0;
      post({ type: 'link', state: 'open' });
    };
    ws.onmessage = (ev) => {
      if (typeof ev.data === 'string') return ws.close(4001, 'text message');  // the link is binary only
      post({ type: 'recv', data: ev.data }, [ev.data]);
    };
    ws.onclose = (ev) => onLinkClosed(ws, ev.code, ev.reason);
  }

  function onLinkClosed(ws, code, reason) {
    if (st.ws !== ws) return;
    st.ws = null;
    post({ type: 'link', state: 'closed', code, reason });
    const why = reason ? ` (${code}: ${reason})` : ` (${code})`;
    if (st.leaving || st.away) {
      setLink('down', 'left the room');  // coming back links again
      return;
    }
    if (code === 4003) {  // not approved (any more): ask again and wait
      setLink('down', 'not approved');
      log('serve says this key is not approved' + why, 'warn');
      st.joined = false;
      $('join-form').hidden = false;
      join();
      return;
    }
    if (code === 4004) {
      setLink('down', 'replaced');
      log('another tab of this browser took over this key' + why, 'warn');
      return;
    }
    st.linkTries++;
    if (st.linkTries > kLinkRetries) {
      setLink('down', 'no link');
      log('the link closed ' + st.linkTries + ' times in a row; reload the page to try again' + why, 'error');
      return;
    }
    setLink('down', 'link closed');
    log('the link closed' + why + '; linking again', 'warn');
    setTimeout(openLink, Math.min(15000, 500 * 2 ** Math.min(st.linkTries, 5)));
  }

  function closeLink(code, reason) {
    if (st.ws) {
      try { st.ws.close(code, reason); } catch (_) { /* already closing */ }
    }
  }

  // The screen turns off or the tab goes to the background: say Bye, so serve drops this
  // member at once and the head re-plans. The Bye is what does it: a hidden page's link stays
  // open (the browser answers serve's pings outside the page's JavaScript), so serve would
  // keep planning a member that computes nothing. The link and the slice held are kept:
  // coming back joins again over the same link, the same key (no new approval, no download).
  function leave() {
    if (!st.started || st.away || st.leaving) return;
    st.away = true;
    setLink(st.ws && st.ws.readyState === WebSocket.OPEN ? 'away' : 'down', 'away: out of the room');
    log('the page is hidden (the screen is off?): this device left the room until it is shown again');
    post({ type: 'leave' });
  }
  // The page goes away (closed, or into the back-forward cache): Bye, and the link closes.
  function goAway() {
    leave();
    if (!st.started || st.leaving) return;
    st.leaving = true;
    setTimeout(() => closeLink(1000, 'the tab left the room'), 500);  // the worker may be frozen
  }
  function comeBack() {
    if (!st.away && !st.leaving) return;
    st.away = false;
    st.leaving = false;
    st.linkTries = 0;
    if (st.ws && st.ws.readyState === WebSocket.OPEN) {
      log('shown again: joining the room again');
      setLink('up', 'linked');
      post({ type: 'rejoin' });
      return;
    }
    log('shown again: linking again');
    openLink();
  }
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'hidden') leave();
    else comeBack();
  });
  window.addEventListener('pagehide', goAway);
  window.addEventListener('pageshow', (ev) => { if (ev.persisted) comeBack(); });

  // ---------- the Hub token (only after the Hub answered 401; memory only) ----------

  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const input = $('token-input');
    const token = input.value.trim();
    input.value = '';
    if (!token) return;
    post({ type: 'token', token });
    setMsg('work-error', '');
    log('a Hub token is held in this page\'s memory; the next turn reads with it');
  });
  $('token-forget').addEventListener('click', () => {
    post({ type: 'forget-token' });
    log('the Hub token is forgotten');
  });
  // What the worker holds (its answer to a token given or forgotten).
  function showToken(held) {
    st.tokenHeld = !!held;
    $('token-form').hidden = st.tokenHeld;
    $('token-held').hidden = !st.tokenHeld;
    $('token-held').dataset.held = String(st.tokenHeld);
    if (!st.tokenHeld) $('token-card').hidden = true;
  }

  $('join-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    join();
  });

  // ---------- start ----------

  function defaultName() {
    const ua = navigator.userAgent || '';
    const kind = /iPhone/.test(ua) ? 'iPhone' : /iPad/.test(ua) ? 'iPad' : /Android/.test(ua) ? 'Android'
      : /Mac OS X/.test(ua) ? 'Mac' : /Windows/.test(ua) ? 'Windows' : /Linux/.test(ua) ? 'Linux' : 'device';
    return 'browser (' + kind + ')';
  }

  async function main() {
    $('name-input').value = load(kNameStore) || defaultName();
    transportNote();
    try {
      const res = await fetch('/api/key');
      if (!res.ok) throw new Error(await errorText(res));
      st.key = await res.json();
    } catch (e) {
      fatal('Cannot read serve\'s key: ' + (e && e.message ? e.message : e));
      return;
    }
    setText('room', st.key.room);
    setText('server-fpr', st.key.fingerprint);
    transportNote();
    // The browser node is in this binary only when it was built with Emscripten.
    let engine;
    try {
      engine = await fetch('/daisy_engine.wasm', { method: 'HEAD' });
    } catch (e) {
      engine = { ok: false, status: 0 };
    }
    if (!engine.ok) {
      fatal(engine.status === 404
        ? 'This serve has no browser node: its binary was built without Emscripten, so this page cannot make ' +
          'keys or compute here. The host can install it (scripts/install-deps.sh) and rebuild; devices can ' +
          'still join with `daisychain node`.'
        : 'Cannot load the browser node from serve (HTTP ' + engine.status + ').');
      return;
    }
    startWorker();
  }

  main();
})();
