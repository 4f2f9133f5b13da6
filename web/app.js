// DaisyChain web UI. Plain JS, no framework, nothing fetched from elsewhere.
// The HTTP contract is docs/HTTP.md. Every piece of text that comes from the server or the
// user goes into the DOM through textContent (never innerHTML).
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);

  // ---------- small helpers ----------

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v === undefined || v === null || v === false) continue;
        if (k === 'class') e.className = v;
        else if (k === 'text') e.textContent = String(v);
        else if (k.startsWith('data-') || k.startsWith('aria-') || k === 'role' || k === 'title' || k === 'type')
          e.setAttribute(k, String(v));
        else e[k] = v;
      }
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function show(node, on) { node.hidden = !on; }

  function setMsg(node, text) {
    node.textContent = text || '';
    node.hidden = !text;
  }

  function fmtBytes(n) {
    if (typeof n !== 'number' || !isFinite(n) || n < 0) return '—';
    const units = ['B', 'KB', 'MB', 'GB', 'TB'];
    let i = 0;
    let v = n;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(v) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)) + ' ' + units[i];
  }

  function fmtCount(n) {
    if (typeof n !== 'number' || !isFinite(n)) return '—';
    const exact = n.toLocaleString('en-US');
    if (n >= 1e9) return (n / 1e9).toFixed(2) + ' B (' + exact + ')';
    if (n >= 1e6) return (n / 1e6).toFixed(2) + ' M (' + exact + ')';
    if (n >= 1e3) return (n / 1e3).toFixed(1) + ' K (' + exact + ')';
    return exact;
  }

  function fmtNum(n, digits) {
    if (typeof n !== 'number' || !isFinite(n)) return '—';
    return n.toFixed(digits);
  }

  function fmtMs(ms) {
    if (typeof ms !== 'number' || !isFinite(ms)) return '—';
    if (ms >= 10000) return (ms / 1000).toFixed(1) + ' s';
    if (ms >= 1000) return (ms / 1000).toFixed(2) + ' s';
    if (ms >= 10) return ms.toFixed(0) + ' ms';
    return ms.toFixed(2) + ' ms';
  }

  function fmtMB(mb) {
    if (typeof mb !== 'number' || !isFinite(mb)) return '—';
    return mb >= 100 ? mb.toFixed(0) : mb >= 1 ? mb.toFixed(1) : mb.toFixed(3);
  }

  function layersText(first, end) {
    if (typeof first !== 'number' || typeof end !== 'number') return '—';
    const n = end - first;
    if (n <= 0) return 'none';
    return (n === 1 ? String(first) : first + '–' + (end - 1)) + ' (' + n + ')';
  }

  // The message of an error answer: {"error": {"message": ...}} or plain text.
  async function errorOf(res) {
    let body = '';
    try { body = await res.text(); } catch (_) { /* ignore */ }
    let msg = '';
    try {
      const j = JSON.parse(body);
      if (j && j.error) msg = typeof j.error === 'string' ? j.error : (j.error.message || '');
      else if (j && j.message) msg = j.message;
    } catch (_) {
      msg = body.trim().slice(0, 500);
    }
    return 'HTTP ' + res.status + (res.statusText ? ' ' + res.statusText : '') + (msg ? ': ' + msg : '');
  }

  async function postJSON(path, body) {
    let res;
    try {
      res = await fetch(path, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
      });
    } catch (e) {
      throw new Error('Cannot reach the server (' + (e && e.message ? e.message : e) + ')');
    }
    if (!res.ok) {
      // The message, and the error's code for callers that act on it (hub_token_required).
      const text = await res.text().catch(() => '');
      let code = null;
      try { const j = JSON.parse(text); code = (j && j.error && j.error.code) || null; } catch (_) { /* not JSON */ }
      const err = new Error(await errorOf(new Response(text, { status: res.status, statusText: res.statusText })));
      err.code = code;
      throw err;
    }
    try {
      return await res.json();
    } catch (e) {
      throw new Error('The server sent an answer that is not JSON');
    }
  }

  // ---------- server-sent events over fetch (POST /api/generate) ----------

  // Feeds text chunks; calls onEvent(name, data) for each complete event.
  class SSEParser {
    constructor(onEvent) {
      this.onEvent = onEvent;
      this.buf = '';
      this.event = '';
      this.data = [];
    }
    push(chunk) {
      this.buf += chunk;
      let i;
      // Lines end with \n, \r\n or \r. A lone \r at the end of the buffer may be the
      // first half of \r\n: keep it until more arrives.
      while ((i = this.buf.search(/\r\n|\r|\n/)) >= 0) {
        if (this.buf[i] === '\r' && i === this.buf.length - 1) break;
        const line = this.buf.slice(0, i);
        const len = this.buf[i] === '\r' && this.buf[i + 1] === '\n' ? 2 : 1;
        this.buf = this.buf.slice(i + len);
        this.line(line);
      }
    }
    line(line) {
      if (line === '') { this.dispatch(); return; }
      if (line[0] === ':') return;  // comment / keep-alive
      const c = line.indexOf(':');
      const field = c < 0 ? line : line.slice(0, c);
      let value = c < 0 ? '' : line.slice(c + 1);
      if (value[0] === ' ') value = value.slice(1);
      if (field === 'event') this.event = value;
      else if (field === 'data') this.data.push(value);
    }
    dispatch() {
      if (this.data.length === 0) { this.event = ''; return; }
      const name = this.event || 'message';
      const data = this.data.join('\n');
      this.event = '';
      this.data = [];
      this.onEvent(name, data);
    }
    end() {
      if (this.buf) { this.line(this.buf); this.buf = ''; }
      this.dispatch();
    }
  }

  function parseData(data) {
    try { return JSON.parse(data); } catch (_) { return null; }
  }

  // ---------- state ----------

  const ui = {
    state: null,          // the last /api/state snapshot
    plan: null,           // the plan shown (state.plan or the answer of /api/load)
    model: null,
    generating: false,
    abort: null,          // AbortController of the turn in progress
    progress: new Map(),  // key -> {stage, name, done, total, el}
    approving: new Set(),
    events: null,
    eventsRetry: 0,
    eventsTimer: null,
    lastEventAt: 0,
  };

  // ---------- status log ----------

  // The same line often comes twice (the turn's own stream and /api/events): show it once.
  const recentLines = new Map();
  function logStatus(line, kind) {
    if (!line) return;
    const now = Date.now();
    const seen = recentLines.get(line);
    recentLines.set(line, now);
    if (seen !== undefined && now - seen < 3000) return;
    if (recentLines.size > 100) for (const [k, t] of recentLines) if (now - t > 3000) recentLines.delete(k);
    const log = $('status-log');
    const t = new Date();
    const stamp = t.toTimeString().slice(0, 8);
    const li = el('li', { class: kind ? 'st-' + kind : '' },
      el('span', { class: 'ts', text: stamp }), ' ', el('span', { class: 'line', text: line }));
    log.append(li);
    while (log.children.length > 200) log.firstElementChild.remove();
    log.scrollTop = log.scrollHeight;
  }

  // ---------- the room ----------

  // "Use this device" and the QR code for phones: serve's LAN address when it listens on
  // one (join_url), else this page's own origin.
  let shownJoinUrl = null;
  function renderJoinUrl(s) {
    const url = s.join_url || location.origin + '/join';
    if (url === shownJoinUrl) return;
    shownJoinUrl = url;
    $('join-url').textContent = url;
    $('join-url').href = url;
    $('use-device').href = url;
    show($('join-url-note'), !s.join_url);
    const box = $('join-qr');
    box.dataset.url = url;
    try {
      box.replaceChildren(window.DaisyQR.svg(url, 4));
    } catch (e) {
      box.replaceChildren(el('p', { class: 'hint', text: 'No QR code: ' + (e && e.message ? e.message : e) }));
    }
  }

  function renderRoom(s) {
    $('room-code').textContent = s.room ? '“' + s.room + '”' : '';
    $('join-cmd').textContent = s.join || '';
    renderJoinUrl(s);
    show($('auto-approve-note'), !!s.auto_approve);

    const busy = $('busy-line');
    if (s.busy || s.queue > 0) {
      busy.textContent = s.busy ? 'ring busy' + (s.queue > 0 ? ', ' + s.queue + ' waiting' : '') : s.queue + ' waiting';
      busy.hidden = false;
    } else {
      busy.hidden = true;
    }

    const box = $('devices');
    const rank = (d) => (d.is_head ? 0 : d.is_serve ? 1 : 2);
    const devices = (Array.isArray(s.devices) ? s.devices : []).map((d, i) => [d, i])
      .sort((a, b) => rank(a[0]) - rank(b[0]) || a[1] - b[1]).map((x) => x[0]);
    const seen = new Set();
    for (const d of devices) {
      const id = String(d.id || d.short || '');
      if (!id) continue;
      seen.add(id);
      let card = null;
      for (const c of box.children) if (c.dataset.id === id) { card = c; break; }
      if (!card) {
        card = buildDeviceCard(id);
        box.append(card);
      }
      updateDeviceCard(card, d);
    }
    for (const c of Array.from(box.children)) if (!seen.has(c.dataset.id)) c.remove();
    // Keep the order of the snapshot (head first).
    let prev = null;
    for (const d of devices) {
      const id = String(d.id || d.short || '');
      let card = null;
      for (const c of box.children) if (c.dataset.id === id) { card = c; break; }
      if (!card) continue;
      const want = prev ? prev.nextElementSibling : box.firstElementChild;
      if (want !== card) box.insertBefore(card, want);
      prev = card;
    }
    show($('devices-empty'), box.children.length === 0);
  }

  function buildDeviceCard(id) {
    const card = el('div', { class: 'device', 'data-testid': 'device', 'data-id': id });
    const head = el('div', { class: 'device-head' },
      el('span', { class: 'dev-name' }),
      el('span', { class: 'dev-short' }),
      el('span', { class: 'badges' }));
    const facts = el('dl', { class: 'facts' });
    for (const [k, label] of [['capacity', 'capacity'], ['backend', 'backend'], ['memory', 'memory budget'], ['probe', 'probe']]) {
      facts.append(el('div', { class: 'fact fact-' + k }, el('dt', { text: label }), el('dd', { class: 'v-' + k })));
    }
    const btn = el('button', { type: 'button', class: 'approve-btn', 'data-id': id, 'data-testid': 'approve-btn', text: 'Approve' });
    btn.addEventListener('click', () => approve(id, btn));
    card.append(head, facts, el('div', { class: 'device-actions' }, btn));
    return card;
  }

  function updateDeviceCard(card, d) {
    const q = (sel) => card.querySelector(sel);
    q('.dev-name').textContent = d.name || '(no name)';
    q('.dev-short').textContent = d.short || String(d.id || '').slice(0, 8);
    q('.dev-short').title = String(d.id || '');
    const badges = q('.badges');
    badges.textContent = '';
    if (d.is_head) badges.append(el('span', { class: 'badge head', text: 'head', title: 'Holds the embedding and the LM head; runs the turns of this page' }));
    if (d.is_serve) badges.append(el('span', { class: 'badge muted', text: 'serve', title: 'This server\'s compute device (takes slices for heads started with daisychain run)' }));
    const status = d.status || 'unknown';
    badges.append(el('span', { class: 'badge st-' + status, text: status }));
    if (d.compute === false && !d.is_head) badges.append(el('span', { class: 'badge muted', text: 'no compute' }));
    card.dataset.status = status;
    q('.v-capacity').textContent = typeof d.gemms_per_s === 'number' ? fmtNum(d.gemms_per_s, d.gemms_per_s >= 100 ? 0 : 1) + ' GEMMs/s' : '—';
    // "avx2", or the choice per product shape: "gemv:avx2 gemm:avx512vnni attention:avx2"
    const backend = q('.v-backend');
    backend.textContent = d.backend ? String(d.backend).split(' ').map((p) => p.replace(':', ' ')).join(' · ') : '—';
    if (d.backend && String(d.backend).includes(':')) backend.title = 'Backend chosen per product shape by measurement';
    else backend.removeAttribute('title');
    q('.v-memory').textContent = fmtBytes(d.free_memory);
    const probe = q('.v-probe');
    probe.textContent = d.probe || 'unknown';
    probe.className = 'v-probe probe-' + (d.probe || 'unknown');
    if (d.probe === 'differs') probe.title = 'This device computes differently: it is left out of the plan';
    else probe.removeAttribute('title');
    const btn = q('.approve-btn');
    const pending = status === 'pending';
    btn.hidden = !pending;
    btn.disabled = !pending || ui.approving.has(card.dataset.id);
    if (!pending) ui.approving.delete(card.dataset.id);
  }

  async function approve(id, btn) {
    ui.approving.add(id);
    btn.disabled = true;
    btn.textContent = 'Approving…';
    setMsg($('room-error'), '');
    try {
      await postJSON('/api/approve', { id });
      logStatus('approved device ' + id.slice(0, 8));
      refreshState();
    } catch (e) {
      ui.approving.delete(id);
      btn.disabled = false;
      setMsg($('room-error'), 'Could not approve ' + id.slice(0, 8) + ': ' + e.message);
    } finally {
      btn.textContent = 'Approve';
    }
  }

  // ---------- model and plan ----------

  function renderModel(m) {
    ui.model = m || null;
    const box = $('model-info');
    box.textContent = '';
    if (!m) { box.hidden = true; return; }
    const rows = [
      ['model', m.model_id || m.source],
      ['revision', m.revision || '—'],
      ['architecture', m.architecture],
      ['parameters', fmtCount(m.parameters)],
      ['weights', fmtBytes(m.weight_bytes)],
      ['layers', m.n_layers],
      ['hidden', m.hidden],
      ['heads', m.n_heads + (m.n_kv_heads !== undefined && m.n_kv_heads !== m.n_heads ? ' (kv ' + m.n_kv_heads + ')' : '')],
      ['vocab', m.vocab],
      ['context', (m.ctx !== undefined ? m.ctx : '—') + (m.max_positions ? ' of ' + m.max_positions : '')],
      ['chat template', m.has_chat_template ? 'yes' : 'no'],
    ];
    for (const [k, v] of rows) {
      box.append(el('div', { class: 'kv', 'data-key': k.replace(/\s+/g, '-') },
        el('dt', { text: k }), el('dd', { text: v === undefined || v === null ? '—' : v })));
    }
    box.hidden = false;
    const input = $('model-input');
    if (!input.value && document.activeElement !== input && m.source) input.value = m.source;
  }

  function renderPlan(p) {
    ui.plan = p || null;
    const table = $('plan-table');
    const tbody = table.tBodies[0];
    tbody.textContent = '';
    const notes = $('plan-notes');
    notes.textContent = '';
    if (!p) {
      $('plan-split-note').hidden = true;
      table.hidden = true;
      $('plan-est').hidden = true;
      setMsg($('plan-warning'), '');
      show($('plan-empty'), true);
      return;
    }
    show($('plan-empty'), false);
    const stages = Array.isArray(p.stages) ? p.stages : [];
    for (const s of stages) {
      tbody.append(el('tr', { 'data-stage': s.stage, 'data-device': s.device_id || '' },
        el('td', { 'data-label': 'Stage', text: s.stage === 0 ? '0 (head)' : s.stage }),
        el('td', { 'data-label': 'Device' }, s.name || String(s.device_id || '').slice(0, 8),
          s.relayed ? ' ' : null,
          s.relayed ? el('span', { class: 'badge relayed', text: 'relayed',
            title: 'This device accepts no connections: its hops go through the server' }) : null),
        el('td', { 'data-label': 'Layers', text: layersText(s.first, s.end) }),
        el('td', { 'data-label': 'Download MB', class: 'num', text: fmtMB(s.download_mb) }),
        el('td', { 'data-label': 'Hold MB', class: 'num', text: fmtMB(s.hold_mb) }),
        el('td', { 'data-label': 'Need / budget MB', class: 'num',
          text: fmtMB(s.need_mb) + ' / ' + (s.budget_mb ? fmtMB(s.budget_mb) : '?') })));
    }
    table.hidden = stages.length === 0;
    const est = $('plan-est');
    if (typeof p.est_ms_per_token === 'number') {
      est.textContent = 'Estimated time per token: ' + fmtMs(p.est_ms_per_token) +
        (stages.length ? ' over ' + stages.length + (stages.length === 1 ? ' device' : ' devices') : '');
      est.hidden = false;
    } else {
      est.hidden = true;
    }
    let warn = '';
    if (p.fits === false) warn = 'This plan cannot fit' + (p.warning ? ': ' + p.warning : '.');
    else if (p.warning) warn = p.warning;
    setMsg($('plan-warning'), warn);
    for (const n of Array.isArray(p.notes) ? p.notes : []) notes.append(el('li', { text: n }));
    updateSplitNote();
  }

  // The plan shown is the automatic one; "Split over N" asks each turn for N devices.
  function updateSplitNote() {
    const note = $('plan-split-note');
    const n = Number($('stages').value);
    const shown = ui.plan && Array.isArray(ui.plan.stages) ? ui.plan.stages.length : 0;
    if (ui.plan && Number.isInteger(n) && n > 0 && n !== shown) {
      note.textContent = 'Turns will be split over ' + n + (n === 1 ? ' device' : ' devices') + ' (Settings: Split over); the plan above is the automatic one.';
      note.hidden = false;
    } else {
      note.hidden = true;
    }
  }

  function applyState(s) {
    if (!s || typeof s !== 'object') return;
    ui.state = s;
    renderRoom(s);
    renderModel(s.model);
    renderPlan(s.plan);
    updateGenerateEnabled();
    // The chat (chat.js) follows the model and the ring from here.
    document.dispatchEvent(new CustomEvent('daisy:state', { detail: s }));
  }

  async function refreshState() {
    try {
      const res = await fetch('/api/state', { cache: 'no-store' });
      if (res.status === 401) {
        // The cookie is gone (another browser, cleared cookies, serve restarted with a new secret).
        ui.noSecret = true;
        setConn('down', 'not signed in: open the URL that `daisychain serve` printed (it ends with ?token=…)');
        return;
      }
      if (!res.ok) throw new Error(await errorOf(res));
      ui.noSecret = false;
      applyState(await res.json());
    } catch (e) {
      // The event stream reports the connection; nothing more to say here.
    }
  }

  async function load(ev) {
    ev.preventDefault();
    const src = $('model-input').value.trim();
    const err = $('load-error');
    setMsg(err, '');
    if (!src) { setMsg(err, 'Type a Hub repo id (owner/name) or the path of a local folder.'); return; }
    let ctx, stages;
    try {
      ctx = intSetting('ctx', 'Context length', 0);
      stages = intSetting('stages', 'Split over', 0, 64);
    } catch (e) { setMsg(err, e.message); return; }
    const btn = $('load-btn');
    btn.disabled = true;
    btn.textContent = 'Loading…';
    logStatus('loading ' + src);
    try {
      const r = await postJSON('/api/load', stages > 0 ? { model: src, ctx, stages } : { model: src, ctx });
      if (r.model) renderModel(r.model);
      renderPlan(r.plan || null);
      logStatus('loaded ' + ((r.model && (r.model.model_id || r.model.source)) || src));
      $('token-form').hidden = true;
    } catch (e) {
      setMsg(err, 'Could not load ' + src + ': ' + e.message);
      logStatus('load failed: ' + e.message, 'error');
      if (e.code === 'hub_token_required') {
        ui.tokenFor = src;
        $('token-form').hidden = false;
        $('token-input').focus();
      }
    } finally {
      btn.disabled = false;
      btn.textContent = 'Load';
      updateGenerateEnabled();
      refreshToken();
    }
  }

  // ---------- the Hub token (asked only after the Hub refused a load for want of one) ----------

  async function refreshToken() {
    try {
      const res = await fetch('/api/hub-token', { cache: 'no-store' });
      if (!res.ok) return;
      const j = await res.json();
      $('token-held').hidden = !(j && j.set);
    } catch (_) { /* the event stream reports the connection */ }
  }

  async function giveToken(ev) {
    ev.preventDefault();
    const input = $('token-input');
    const token = input.value.trim();
    const err = $('load-error');
    if (!token) { setMsg(err, 'Paste a Hugging Face token (hf_…), or load another model.'); return; }
    $('token-btn').disabled = true;
    try {
      await postJSON('/api/hub-token', { token });
      input.value = '';  // the page keeps no copy
      $('token-form').hidden = true;
      setMsg(err, '');
      if (ui.tokenFor) $('model-input').value = ui.tokenFor;
      $('load-form').requestSubmit();
    } catch (e) {
      setMsg(err, 'The token was not taken: ' + e.message);
    } finally {
      $('token-btn').disabled = false;
      refreshToken();
    }
  }

  async function forgetToken() {
    try {
      await postJSON('/api/hub-token/forget', {});
      logStatus('the Hub token was forgotten');
    } catch (e) {
      setMsg($('load-error'), 'Could not forget the token: ' + e.message);
    }
    refreshToken();
  }

  // ---------- download progress ----------

  function onProgress(p) {
    if (!p || typeof p !== 'object') return;
    const key = (p.device_id || '') + '#' + p.stage;
    let item = ui.progress.get(key);
    const list = $('progress-list');
    if (!item) {
      const bar = el('progress', { max: 1, value: 0 });
      const label = el('span', { class: 'p-label' });
      const nums = el('span', { class: 'p-nums' });
      const row = el('div', { class: 'progress-item', 'data-testid': 'progress-item', 'data-stage': p.stage, 'data-device': p.device_id || '' },
        el('div', { class: 'p-top' }, label, nums), bar);
      item = { row, bar, label, nums };
      ui.progress.set(key, item);
      // Keep stages in order.
      let before = null;
      for (const c of list.children) if (Number(c.dataset.stage) > Number(p.stage)) { before = c; break; }
      list.insertBefore(row, before);
    }
    const done = Number(p.bytes_done) || 0;
    const total = Number(p.bytes_total) || 0;
    item.label.textContent = 'stage ' + p.stage + ' · ' + (p.name || String(p.device_id || '').slice(0, 8));
    item.nums.textContent = fmtBytes(done) + ' / ' + fmtBytes(total) + (total > 0 ? ' (' + Math.floor((100 * done) / total) + '%)' : '');
    item.bar.max = total > 0 ? total : 1;
    item.bar.value = total > 0 ? Math.min(done, total) : 0;
    item.row.classList.toggle('complete', total > 0 && done >= total);
    $('progress-title').hidden = false;
  }

  // ---------- settings ----------

  function intSetting(id, label, min, max) {
    const raw = $(id).value.trim();
    const v = raw === '' ? NaN : Number(raw);
    if (!Number.isInteger(v) || v < min || (max !== undefined && v > max))
      throw new Error(label + ' must be a whole number' + (max !== undefined ? ' from ' + min + ' to ' + max : min > 0 ? ' of at least ' + min : ' (0 or more)') + '.');
    return v;
  }

  function floatSetting(id, label, min, max) {
    const raw = $(id).value.trim();
    const v = raw === '' ? NaN : Number(raw);
    if (!isFinite(v) || v < min || (max !== undefined && v > max))
      throw new Error(label + ' must be a number' + (max !== undefined ? ' from ' + min + ' to ' + max : ' of at least ' + min) + '.');
    return v;
  }

  function readSettings() {
    const stages = intSetting('stages', 'Split over', 0, 64);
    const s = {
      max_tokens: intSetting('max-tokens', 'Tokens', 1),
      ctx: intSetting('ctx', 'Context length', 0),
      temperature: floatSetting('temperature', 'Temperature', 0),
      seed: intSetting('seed', 'Seed', 0),
      top_p: floatSetting('top-p', 'Top-p', 0, 1),
      top_k: intSetting('top-k', 'Top-k', 0),
      verify: $('verify').checked,
      json: $('json').checked,
    };
    if (stages > 0) s.stages = stages;  // absent: the session's plan
    return s;
  }

  // ---------- generate ----------

  function updateGenerateEnabled() {
    const btn = $('generate-btn');
    btn.disabled = ui.generating;
    btn.title = ui.state && !ui.state.model && !ui.model ? 'Load a model first' : '';
  }

  function setGenState(text, state) {
    const s = $('gen-state');
    s.textContent = text || '';
    $('output').dataset.state = state || 'idle';
  }

  function resetTurnView() {
    const out = $('output');
    out.textContent = '';
    out.dataset.tokens = '0';
    out.classList.remove('json-ok', 'json-bad');
    const v = $('verify-line');
    v.hidden = true;
    v.textContent = '';
    v.className = 'verify-line';
    v.removeAttribute('data-verified');
    v.removeAttribute('data-mismatch-position');
    setMsg($('gen-error'), '');
    $('stats').hidden = true;
    $('latency-table').hidden = true;
    $('latency-table').tBodies[0].textContent = '';
    $('progress-list').textContent = '';
    $('progress-title').hidden = true;
    ui.progress.clear();
  }

  function renderDone(d) {
    const out = $('output');
    // The streamed pieces already show the text; the final text is authoritative.
    if (typeof d.text === 'string' && d.text !== out.textContent) out.textContent = d.text;
    if ($('json').checked && typeof d.text === 'string') {
      let ok = true;
      try { JSON.parse(d.text); } catch (_) { ok = false; }
      out.classList.add(ok ? 'json-ok' : 'json-bad');
      if (!ok && d.finish_reason === 'length') logStatus('the JSON was cut off by the token limit', 'warn');
    }
    $('stat-tps').textContent = fmtNum(d.tokens_per_s, 1);
    $('stat-hops').textContent = typeof d.ring_hops === 'number' ? String(d.ring_hops) : '—';
    $('stat-laps').textContent = typeof d.laps === 'number' ? String(d.laps) + (typeof d.lap_ms === 'number' ? ' · ' + fmtMs(d.lap_ms) : '') : '—';
    $('stat-prefill').textContent = fmtMs(d.prefill_ms) + (d.reused_positions ? ' (' + d.reused_positions + ' cached)' : '');
    $('stat-decode').textContent = fmtMs(d.decode_ms);
    $('stat-finish').textContent = (d.finish_reason || '—') + (d.replays ? ' · ' + d.replays + ' replay' + (d.replays > 1 ? 's' : '') : '');
    $('stats').hidden = false;
    const tbody = $('latency-table').tBodies[0];
    tbody.textContent = '';
    for (const s of Array.isArray(d.stages) ? d.stages : []) {
      tbody.append(el('tr', { 'data-stage': s.stage },
        el('td', { 'data-label': 'Stage', text: s.stage === 0 ? '0 (head)' : s.stage }),
        el('td', { 'data-label': 'Device', text: s.name || '—' }),
        el('td', { 'data-label': 'Layers', text: layersText(s.first, s.end) }),
        el('td', { 'data-label': 'Hops', class: 'num', text: typeof s.hops === 'number' ? s.hops : '—' }),
        el('td', { 'data-label': 'ms / hop', class: 'num', text: fmtNum(s.ms_per_hop, 3) })));
    }
    $('latency-table').hidden = tbody.children.length === 0;
    const v = $('verify-line');
    if (d.verified === true || d.verified === false) {
      v.textContent = d.verify_message || (d.verified ? 'VERIFIED' : 'MISMATCH');
      v.className = 'verify-line ' + (d.verified ? 'ok' : 'bad');
      v.dataset.verified = String(d.verified);
      // The first position whose id or bits differ (the message names it too).
      if (typeof d.mismatch_position === 'number') v.dataset.mismatchPosition = String(d.mismatch_position);
      v.hidden = false;
    } else if (d.verify_message) {
      v.textContent = d.verify_message;
      v.className = 'verify-line';
      v.hidden = false;
    }
  }

  // POSTs `body` as JSON to `url` and feeds the server-sent events of the answer to
  // onEvent until the stream ends; throws an Error with a message for the user (`what` names
  // what was being received), or the abort itself when `signal` was aborted.
  async function streamEvents(url, body, signal, onEvent, what) {
    let res;
    try {
      res = await fetch(url, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream' },
        body: JSON.stringify(body),
        signal,
      });
    } catch (e) {
      if (signal.aborted) throw e;
      throw new Error('Cannot reach the server (' + (e && e.message ? e.message : e) + ').');
    }
    if (!res.ok) throw new Error(await errorOf(res));
    if (!res.body) throw new Error('The browser gave no response stream.');
    const parser = new SSEParser(onEvent);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.push(value);
      }
    } catch (e) {
      if (signal.aborted) throw e;
      throw new Error('The connection to the server was lost during ' + what + ' (' + (e && e.message ? e.message : e) + ').');
    }
    parser.end();
  }

  async function generate(ev) {
    ev.preventDefault();
    if (ui.generating) return;
    let settings;
    try {
      settings = readSettings();
      setMsg($('settings-error'), '');
    } catch (e) {
      setMsg($('settings-error'), e.message);
      return;
    }
    const prompt = $('prompt').value;
    resetTurnView();
    if (!prompt) { setMsg($('gen-error'), 'Type a prompt first.'); return; }
    const body = Object.assign({ prompt }, settings);
    ui.generating = true;
    updateGenerateEnabled();
    $('stop-btn').hidden = false;
    setGenState('starting…', 'running');
    const ctrl = new AbortController();
    ui.abort = ctrl;
    const out = $('output');
    let tokens = 0;
    let finished = false;  // a done or error event arrived
    const t0 = performance.now();

    const onEvent = (name, data) => {
      const d = parseData(data);
      switch (name) {
        case 'queued':
          setGenState('waiting for the ring' + (d && d.position ? ' (position ' + d.position + ')' : '') + '…', 'queued');
          break;
        case 'status':
          if (d && d.line) { logStatus(d.line); if (!tokens) setGenState(d.line, 'running'); }
          break;
        case 'progress':
          onProgress(d);
          break;
        case 'token':
          if (d && typeof d.text === 'string') {
            out.append(document.createTextNode(d.text));
            tokens++;
            out.dataset.tokens = String(tokens);
            const secs = (performance.now() - t0) / 1000;
            setGenState(tokens + (tokens === 1 ? ' token' : ' tokens') + ' · ' + secs.toFixed(1) + ' s', 'streaming');
          }
          break;
        case 'retract':
          // An audit caught a stage: the tokens after `kept` were withdrawn and the replay
          // streams them again. The server sends the text that stands.
          if (d && typeof d.text === 'string') {
            out.textContent = d.text;
            tokens = Number(d.kept) || 0;
            out.dataset.tokens = String(tokens);
            logStatus('audit: ' + (d.kept || 0) + ' token(s) stand; the rest is replayed', 'error');
          }
          break;
        case 'done':
          finished = true;
          if (d) renderDone(d);
          setGenState('done' + (d && d.finish_reason ? ' (' + d.finish_reason + ')' : ''), 'done');
          break;
        case 'error':
          finished = true;
          setMsg($('gen-error'), (d && d.message) || data || 'The server reported an error.');
          logStatus('error: ' + ((d && d.message) || data), 'error');
          setGenState('failed', 'error');
          break;
        default:
          break;
      }
    };

    try {
      await streamEvents('/api/generate', body, ctrl.signal, onEvent, 'the turn');
      if (!finished) throw new Error('The connection to the server was lost before the turn finished' + (tokens ? ' (after ' + tokens + ' tokens)' : '') + '.');
    } catch (e) {
      if (ctrl.signal.aborted) {
        setGenState('stopped', 'stopped');
        logStatus('stopped by you');
      } else {
        setMsg($('gen-error'), e.message);
        logStatus('error: ' + e.message, 'error');
        setGenState('failed', 'error');
      }
    } finally {
      ui.generating = false;
      ui.abort = null;
      $('stop-btn').hidden = true;
      updateGenerateEnabled();
    }
  }

  // ---------- live updates: /api/events ----------

  function setConn(state, text) {
    const c = $('conn');
    c.dataset.state = state;
    c.textContent = text;
  }

  function connectEvents() {
    if (ui.eventsTimer) { clearTimeout(ui.eventsTimer); ui.eventsTimer = null; }
    if (ui.events) { ui.events.close(); ui.events = null; }
    let es;
    try {
      es = new EventSource('/api/events');
    } catch (e) {
      scheduleReconnect();
      return;
    }
    ui.events = es;
    es.addEventListener('open', () => {
      ui.eventsRetry = 0;
      ui.lastEventAt = Date.now();
      setConn('live', 'live');
    });
    es.addEventListener('state', (m) => {
      ui.lastEventAt = Date.now();
      setConn('live', 'live');
      applyState(parseData(m.data));
    });
    es.addEventListener('status', (m) => {
      ui.lastEventAt = Date.now();
      const d = parseData(m.data);
      if (d && d.line) logStatus(d.line);
    });
    es.addEventListener('progress', (m) => {
      ui.lastEventAt = Date.now();
      onProgress(parseData(m.data));
    });
    es.addEventListener('room_text', (m) => {
      ui.lastEventAt = Date.now();
      onRoomText(parseData(m.data));
    });
    es.addEventListener('error', () => {
      // The browser retries by itself while the stream is CONNECTING; when it gives up
      // (CLOSED, e.g. an HTTP error) we retry with a growing delay.
      setConn('down', 'connection lost, reconnecting…');
      if (es.readyState === EventSource.CLOSED) scheduleReconnect();
    });
  }

  // ---------- what the room sees (room_text events: every head's turns, as a device gets them) ----------

  const roomTurns = new Map();  // head id + stream -> { box, pre, who, text, starts }
  function onRoomText(d) {
    if (!d || typeof d.kind !== 'string') return;
    const key = (d.head_id || '') + '/' + d.stream;
    let t = roomTurns.get(key);
    if (d.kind === 'begin') {
      if (t) return;
      const who = el('div', { class: 'who' });
      const pre = el('pre', { 'data-testid': 'room-turn-text' });
      const box = el('div', { class: 'room-turn', 'data-testid': 'room-turn', 'data-state': 'streaming' }, who, pre);
      t = { box, pre, who, text: '', starts: [], head: (d.head || 'a head') + ' (' + String(d.head_id || '').slice(0, 8) + ')' };
      who.textContent = t.head + ' · generating…';
      roomTurns.set(key, t);
      const list = $('room-stream');
      list.prepend(box);
      // The last few turns stay.
      while (list.children.length > 5) {
        const old = list.lastElementChild;
        for (const [k, v] of roomTurns) if (v.box === old) roomTurns.delete(k);
        old.remove();
      }
      $('room-stream-empty').hidden = true;
      return;
    }
    if (!t) return;  // a turn begun before this page listened
    if (d.kind === 'piece') {
      if (!(d.index >= 0) || d.index > t.starts.length + 64) return;  // a gap no turn makes
      while (t.starts.length <= d.index) t.starts.push(t.text.length);
      t.text += d.text || '';
    } else if (d.kind === 'retract') {
      if (d.index < t.starts.length) { t.text = t.text.slice(0, t.starts[d.index]); t.starts.length = d.index; }
    } else if (d.kind === 'end' || d.kind === 'failed') {
      if (d.kind === 'end') t.text += d.text || '';
      t.box.dataset.state = d.kind === 'end' ? 'done' : 'failed';
      t.who.textContent = t.head + ' · ' + (d.kind === 'end' ? d.index + ' tokens' : 'failed after ' + d.index + ' tokens');
      roomTurns.delete(key);
    }
    t.pre.textContent = t.text;
  }

  function scheduleReconnect() {
    if (ui.events) { ui.events.close(); ui.events = null; }
    if (ui.eventsTimer) return;
    const delay = Math.min(10000, 500 * Math.pow(2, ui.eventsRetry++));
    if (!ui.noSecret) setConn('down', 'connection lost, reconnecting in ' + Math.ceil(delay / 1000) + ' s…');
    ui.eventsTimer = setTimeout(() => { ui.eventsTimer = null; connectEvents(); refreshState(); }, delay);
  }

  // The server sends a state at least every 2 s: a long silence means a dead stream that
  // the browser has not noticed (e.g. a proxy holding the socket).
  setInterval(() => {
    if (ui.events && ui.events.readyState === EventSource.OPEN && Date.now() - ui.lastEventAt > 8000) {
      setConn('down', 'no news from the server, reconnecting…');
      scheduleReconnect();
    }
  }, 2000);

  // ---------- wiring ----------

  $('load-form').addEventListener('submit', load);
  $('token-form').addEventListener('submit', giveToken);
  $('token-forget').addEventListener('click', forgetToken);
  $('stages').addEventListener('input', updateSplitNote);
  $('generate-form').addEventListener('submit', generate);
  $('stop-btn').addEventListener('click', () => { if (ui.abort) ui.abort.abort(); });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) $('generate-form').requestSubmit();
  });
  $('copy-join').addEventListener('click', async () => {
    const text = $('join-cmd').textContent;
    try {
      await navigator.clipboard.writeText(text);
      $('copy-join').textContent = 'Copied';
    } catch (_) {
      const r = document.createRange();
      r.selectNodeContents($('join-cmd'));
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(r);
      $('copy-join').textContent = 'Selected';
    }
    setTimeout(() => { $('copy-join').textContent = 'Copy'; }, 1500);
  });

  // For tests and debugging.
  window.daisy = { SSEParser, ui, el, parseData, errorOf, streamEvents, readSettings, logStatus, fmtMs, fmtNum, layersText };

  refreshState();
  refreshToken();
  connectEvents();
})();
