// The chat view of the DaisyChain web UI: conversations kept in this browser (localStorage),
// each turn sent to POST /api/chat (docs/HTTP.md) with the conversation id as the
// prefix-cache key, the reply streamed into a bubble and rendered as a safe subset of
// Markdown. Text from the model or the user reaches the DOM only through text nodes and
// textContent (never innerHTML); links are made only for http(s) URLs.
'use strict';

(function () {
  const D = window.daisy;  // app.js: el, SSEParser, parseData, errorOf, readSettings, logStatus, ...
  if (!D) return;
  const $ = (id) => document.getElementById(id);
  const el = D.el;
  const EMPTY_NOTE = $('chat-empty');  // shown while a conversation has no message

  // ---------- Markdown, safely ----------

  // Inline spans: `code`, **bold**, __bold__, *italic*, _italic_, [text](http(s) URL).
  const INLINE = new RegExp([
    /`([^`\n]+)`/.source,                               // 1: code
    /\*\*(?=\S)([^*]+?)\*\*/.source,                     // 2: bold
    /__(?=\S)([^_]+?)__/.source,                         // 3: bold
    /\*(?=\S)([^*\n]+?)\*/.source,                       // 4: italic
    /\b_(?=\S)([^_\n]+?)_\b/.source,                      // 5: italic (not inside snake_case_words)
    /\[([^\]\n]+)\]\(([^)\s]+)\)/.source,                 // 6, 7: link text, URL
  ].join('|'), 'g');

  function safeHref(url) {
    try {
      const u = new URL(url);
      return u.protocol === 'http:' || u.protocol === 'https:' ? u.href : null;
    } catch (_) {
      return null;
    }
  }

  function appendInline(parent, text, depth) {
    let last = 0;
    INLINE.lastIndex = 0;
    const re = new RegExp(INLINE.source, 'g');  // a fresh one: appendInline recurses
    let m;
    while ((m = re.exec(text)) !== null) {
      if (m[0] === '') { re.lastIndex++; continue; }
      if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
      if (m[1] !== undefined) {
        parent.append(el('code', { text: m[1] }));
      } else if (m[2] !== undefined || m[3] !== undefined) {
        const b = el('strong');
        if (depth < 4) appendInline(b, m[2] !== undefined ? m[2] : m[3], depth + 1); else b.textContent = m[0];
        parent.append(b);
      } else if (m[4] !== undefined || m[5] !== undefined) {
        const i = el('em');
        if (depth < 4) appendInline(i, m[4] !== undefined ? m[4] : m[5], depth + 1); else i.textContent = m[0];
        parent.append(i);
      } else {
        const href = safeHref(m[7]);
        if (href) {
          const a = el('a', { text: m[6] });
          a.href = href;
          a.target = '_blank';
          a.rel = 'noopener noreferrer';
          parent.append(a);
        } else {
          parent.append(document.createTextNode(m[0]));  // not http(s): shown as written
        }
      }
      last = m.index + m[0].length;
    }
    if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
  }

  // Blocks: ``` fenced code (an unclosed fence runs to the end, as while streaming),
  // # headings, - / * / + and 1. lists, > quotes, paragraphs (single newlines kept).
  function renderMarkdown(text) {
    const frag = document.createDocumentFragment();
    const lines = String(text).split('\n');
    let i = 0;
    const isFence = (l) => /^\s*```/.test(l);
    const isBullet = (l) => /^\s*[-*+]\s+/.test(l);
    const isNumbered = (l) => /^\s*\d{1,9}[.)]\s+/.test(l);
    const isQuote = (l) => /^\s*>/.test(l);
    const isHeading = (l) => /^\s*#{1,6}\s+/.test(l);
    while (i < lines.length) {
      const line = lines[i];
      if (line.trim() === '') { i++; continue; }
      if (isFence(line)) {
        const lang = line.trim().slice(3).trim();
        const body = [];
        i++;
        while (i < lines.length && !isFence(lines[i])) body.push(lines[i++]);
        i++;  // the closing fence
        const code = el('code', { text: body.join('\n') });
        if (/^[\w+.-]{1,32}$/.test(lang)) code.dataset.lang = lang;
        frag.append(el('pre', null, code));
        continue;
      }
      if (isHeading(line)) {
        const p = el('p', { class: 'md-h' });
        appendInline(p, line.replace(/^\s*#{1,6}\s+/, ''), 0);
        frag.append(p);
        i++;
        continue;
      }
      if (isBullet(line) || isNumbered(line)) {
        const numbered = isNumbered(line);
        const list = el(numbered ? 'ol' : 'ul');
        if (numbered) {
          const start = parseInt(line.trim(), 10);
          if (start > 1) list.start = start;
        }
        while (i < lines.length && (numbered ? isNumbered(lines[i]) : isBullet(lines[i]))) {
          const li = el('li');
          appendInline(li, lines[i].replace(numbered ? /^\s*\d{1,9}[.)]\s+/ : /^\s*[-*+]\s+/, ''), 0);
          list.append(li);
          i++;
        }
        frag.append(list);
        continue;
      }
      if (isQuote(line)) {
        const q = el('blockquote');
        const body = [];
        while (i < lines.length && isQuote(lines[i])) body.push(lines[i++].replace(/^\s*>\s?/, ''));
        appendLines(q, body);
        frag.append(q);
        continue;
      }
      const body = [];
      while (i < lines.length && lines[i].trim() !== '' && !isFence(lines[i]) && !isHeading(lines[i]) &&
             !isBullet(lines[i]) && !isNumbered(lines[i]) && !isQuote(lines[i])) body.push(lines[i++]);
      const p = el('p');
      appendLines(p, body);
      frag.append(p);
    }
    return frag;
  }

  function appendLines(parent, lines) {
    lines.forEach((l, k) => {
      if (k > 0) parent.append(el('br'));
      appendInline(parent, l, 0);
    });
  }

  // ---------- conversations, kept in this browser ----------

  // Only the conversations (messages, system prompt, reply stats) are stored: never the
  // admin secret, which lives in an HttpOnly cookie that scripts cannot read.
  const STORE = 'daisy.chat.v1';
  const MAX_CONVERSATIONS = 50;

  function newId() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    const b = new Uint8Array(16);
    crypto.getRandomValues(b);
    return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  }

  function loadStore() {
    try {
      const s = JSON.parse(localStorage.getItem(STORE) || 'null');
      if (s && Array.isArray(s.conversations)) {
        s.conversations = s.conversations.filter((c) => c && typeof c.id === 'string' && Array.isArray(c.messages));
        return s;
      }
    } catch (_) { /* unreadable: start over */ }
    return { conversations: [], current: null };
  }

  const chat = {
    store: loadStore(),
    busy: false,
    abort: null,
    lastDone: null,  // the last `done` event (tests and debugging)
  };

  function save() {
    const s = chat.store;
    s.conversations.sort((a, b) => (b.updated || 0) - (a.updated || 0));
    // The oldest go first when there are too many or storage is full.
    while (s.conversations.length > MAX_CONVERSATIONS) s.conversations.pop();
    for (let tries = 0; tries < MAX_CONVERSATIONS; tries++) {
      try {
        localStorage.setItem(STORE, JSON.stringify(s));
        return;
      } catch (_) {
        if (s.conversations.length <= 1) break;
        s.conversations.pop();
      }
    }
    D.logStatus('this browser would not store the conversations (storage full or disabled)', 'warn');
  }

  function current() {
    const s = chat.store;
    let c = s.conversations.find((x) => x.id === s.current);
    if (!c) {
      c = { id: newId(), title: '', system: '', messages: [], updated: Date.now() };
      s.conversations.unshift(c);
      s.current = c.id;
    }
    return c;
  }

  function titleOf(c) {
    const first = c.messages.find((m) => m.role === 'user');
    const t = first ? first.content.replace(/\s+/g, ' ').trim() : '';
    return t ? (t.length > 60 ? t.slice(0, 60) + '…' : t) : 'New chat';
  }

  // ---------- rendering ----------

  function renderList() {
    const list = $('chat-list');
    list.textContent = '';
    const cur = current();
    for (const c of chat.store.conversations) {
      if (c.messages.length === 0 && c.id !== cur.id) continue;
      const open = el('button', { type: 'button', class: 'chat-open', text: titleOf(c), title: titleOf(c) });
      open.addEventListener('click', () => switchTo(c.id));
      const del = el('button', { type: 'button', class: 'chat-del', text: '×', title: 'Delete this conversation',
        'aria-label': 'Delete conversation ' + titleOf(c) });
      del.addEventListener('click', () => remove(c.id));
      const isCurrent = c.id === cur.id ? 'true' : 'false';
      list.append(el('li', { class: 'chat-item', 'data-id': c.id, 'aria-current': isCurrent }, open, del));
    }
  }

  function renderConversation() {
    const c = current();
    const box = $('chat-messages');
    box.textContent = '';
    if (c.messages.length === 0) box.append(EMPTY_NOTE);
    c.messages.forEach((m, k) => box.append(messageRow(c, m, k)));
    $('chat-system').value = c.system || '';
    if (c.system) $('chat-system-box').open = true;
    box.scrollTop = box.scrollHeight;
    renderList();
  }

  function lastAssistantIndex(c) {
    for (let k = c.messages.length - 1; k >= 0; k--) if (c.messages[k].role === 'assistant') return k;
    return -1;
  }

  function messageRow(c, m, k) {
    const row = el('div', { class: 'msg-row ' + m.role, 'data-role': m.role, 'data-index': k });
    const bubble = el('div', { class: 'bubble' });
    if (m.role === 'assistant') bubble.append(renderMarkdown(m.content));
    else bubble.textContent = m.content;  // the user's words as typed; errors as said
    row.append(bubble);
    if (m.role === 'assistant') row.append(...assistantMeta(c, m, k));
    return row;
  }

  // The lines under a reply: stats, Verify, Copy / Regenerate, and the timings.
  function assistantMeta(c, m, k) {
    const meta = m.meta || {};
    const line = el('div', { class: 'msg-meta' });
    if (meta.stopped) line.append(el('span', { class: 'msg-stopped', text: 'stopped' }));
    if (typeof meta.reused_positions === 'number') {
      const stats = el('span', {
        class: 'msg-stats',
        text: 'reused ' + meta.reused_positions + ' position' + (meta.reused_positions === 1 ? '' : 's') +
          (typeof meta.ring_positions === 'number' ? ' · ' + meta.ring_positions + ' sent around the ring' : '') +
          (typeof meta.tokens_per_s === 'number' ? ' · ' + D.fmtNum(meta.tokens_per_s, 1) + ' tok/s' : '') +
          (meta.finish_reason ? ' · ' + meta.finish_reason : ''),
      });
      stats.dataset.reused = String(meta.reused_positions);
      if (typeof meta.ring_positions === 'number') stats.dataset.ringPositions = String(meta.ring_positions);
      if (typeof meta.prompt_tokens === 'number') stats.dataset.promptTokens = String(meta.prompt_tokens);
      line.append(stats);
    }
    if (meta.verified === true || meta.verified === false) {
      const v = el('span', { class: 'msg-verify ' + (meta.verified ? 'ok' : 'bad'),
        text: meta.verify_message || (meta.verified ? 'VERIFIED' : 'MISMATCH') });
      v.dataset.verified = String(meta.verified);
      if (typeof meta.mismatch_position === 'number') v.dataset.mismatchPosition = String(meta.mismatch_position);
      line.append(v);
    }
    const copy = el('button', { type: 'button', class: 'ghost msg-copy', text: 'Copy', title: 'Copy this reply' });
    copy.addEventListener('click', () => copyText(m.content, copy));
    line.append(copy);
    if (k === lastAssistantIndex(c)) {
      const regen = el('button',
        { type: 'button', class: 'ghost msg-regen', text: 'Regenerate', title: 'Ask for this reply again' });
      regen.disabled = chat.busy;
      regen.addEventListener('click', regenerate);
      line.append(regen);
    }
    const out = [line];
    if (typeof meta.prefill_ms === 'number') {
      const t = el('details', { class: 'msg-timings' });
      const laps = typeof meta.lap_ms === 'number' && meta.laps
        ? ' · ' + meta.laps + ' laps of ' + D.fmtMs(meta.lap_ms) : '';
      t.append(el('summary',
        { text: 'timings: prefill ' + D.fmtMs(meta.prefill_ms) + ' · decode ' + D.fmtMs(meta.decode_ms) + laps }));
      const stages = Array.isArray(meta.stages) ? meta.stages : [];
      if (stages.length) {
        const tbody = el('tbody');
        for (const s of stages) {
          tbody.append(el('tr', null,
            el('td', { 'data-label': 'Stage', text: s.stage === 0 ? '0 (head)' : s.stage }),
            el('td', { 'data-label': 'Device', text: s.name || '—' }),
            el('td', { 'data-label': 'Layers', text: D.layersText(s.first, s.end) }),
            el('td', { 'data-label': 'Hops', class: 'num', text: typeof s.hops === 'number' ? s.hops : '—' }),
            el('td', { 'data-label': 'ms / hop', class: 'num', text: D.fmtNum(s.ms_per_hop, 3) })));
        }
        t.append(el('div', { class: 'table-wrap' }, el('table', null,
          el('thead', null, el('tr', null, el('th', { text: 'Stage' }), el('th', { text: 'Device' }),
            el('th', { text: 'Layers' }), el('th', { class: 'num', text: 'Hops' }),
            el('th', { class: 'num', text: 'ms / hop' }))), tbody)));
      }
      out.push(t);
    }
    return out;
  }

  async function copyText(text, btn) {
    try {
      await navigator.clipboard.writeText(text);
      btn.textContent = 'Copied';
    } catch (_) {
      // Without the clipboard API (plain HTTP on another address): a hidden field and execCommand.
      const ta = el('textarea');
      ta.value = text;
      ta.setAttribute('readonly', '');
      ta.style.position = 'fixed';
      ta.style.opacity = '0';
      document.body.append(ta);
      ta.select();
      let ok = false;
      try { ok = document.execCommand('copy'); } catch (_) { ok = false; }
      ta.remove();
      btn.textContent = ok ? 'Copied' : 'Copy failed';
    }
    setTimeout(() => { btn.textContent = 'Copy'; }, 1500);
  }

  function setChatState(text) {
    $('chat-state').textContent = text || '';
  }

  function setBusy(on) {
    chat.busy = on;
    $('chat-send').disabled = on;
    $('chat-stop').hidden = !on;
    $('chat-new').disabled = on;
    for (const b of document.querySelectorAll('#chat-section .msg-regen, #chat-list button')) b.disabled = on;
  }

  // The mode follows the loaded model: its chat template, or plain completion.
  function renderMode(s) {
    const m = $('chat-mode');
    const model = s && s.model;
    if (!model) {
      m.dataset.mode = 'none';
      m.textContent = 'no model loaded';
    } else if (model.has_chat_template) {
      m.dataset.mode = 'template';
      m.textContent = 'chat template of ' + (model.model_id || 'the model');
    } else {
      m.dataset.mode = 'plain';
      m.textContent = 'plain completion: ' + (model.model_id || 'this model') + ' has no chat template';
    }
  }

  // ---------- a turn ----------

  function wireMessages(c) {
    const out = [];
    const system = (c.system || '').trim() ? c.system : '';
    if (system) out.push({ role: 'system', content: system });
    for (const m of c.messages) {
      if (m.role === 'user' || m.role === 'assistant') out.push({ role: m.role, content: m.content });
    }
    return out;
  }

  function pushError(c, text) {
    c.messages.push({ role: 'error', content: text });
    c.updated = Date.now();
    save();
    renderConversation();
  }

  async function send(text) {
    if (chat.busy) return;
    const c = current();
    c.system = $('chat-system').value;
    let settings;
    try {
      settings = D.readSettings();
    } catch (e) {
      pushError(c, e.message + ' (Settings)');
      return;
    }
    if (text !== null) {
      c.messages.push({ role: 'user', content: text });
      if (!c.title) c.title = titleOf(c);
    }
    c.updated = Date.now();
    save();
    renderConversation();
    await runTurn(c, settings);
  }

  function regenerate() {
    if (chat.busy) return;
    const c = current();
    // Drop the last reply (and any error after the last user message), then ask again.
    while (c.messages.length && c.messages[c.messages.length - 1].role !== 'user') c.messages.pop();
    if (!c.messages.length) return;
    send(null);
  }

  async function runTurn(c, settings) {
    const body = {
      conversation: c.id,
      messages: wireMessages(c),
      max_tokens: settings.max_tokens,
      temperature: settings.temperature,
      seed: settings.seed,
      top_p: settings.top_p,
      top_k: settings.top_k,
      verify: settings.verify,
    };
    if (settings.ctx > 0) body.ctx = settings.ctx;
    if (settings.stages) body.stages = settings.stages;
    const reply = { role: 'assistant', content: '', meta: {} };
    const box = $('chat-messages');
    if (EMPTY_NOTE.parentNode === box) EMPTY_NOTE.remove();
    const row = el('div', { class: 'msg-row assistant', 'data-role': 'assistant', 'data-state': 'waiting' });
    const bubble = el('div', { class: 'bubble' });
    row.append(bubble);
    box.append(row);
    box.scrollTop = box.scrollHeight;
    const ctrl = new AbortController();
    chat.abort = ctrl;
    setBusy(true);
    setChatState('sending…');
    let tokens = 0;
    let finished = false;
    let error = null;
    let pending = false;
    const paint = () => {  // at most once a frame while streaming
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        bubble.textContent = '';
        bubble.append(renderMarkdown(reply.content));
        const near = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
        if (near) box.scrollTop = box.scrollHeight;
      });
    };
    const onEvent = (name, data) => {
      const d = D.parseData(data);
      switch (name) {
        case 'queued':
          setChatState('waiting for the ring' + (d && d.position ? ' (position ' + d.position + ')' : '') + '…');
          break;
        case 'status':
          if (d && d.line) { D.logStatus(d.line); if (!tokens) setChatState(d.line); }
          break;
        case 'token':
          if (d && typeof d.text === 'string') {
            reply.content += d.text;
            if (d.id !== null) tokens++;
            row.dataset.state = 'streaming';
            row.dataset.tokens = String(tokens);
            setChatState(tokens + (tokens === 1 ? ' token' : ' tokens'));
            paint();
          }
          break;
        case 'retract':
          if (d && typeof d.text === 'string') { reply.content = d.text; tokens = Number(d.kept) || 0; paint(); }
          break;
        case 'done':
          finished = true;
          if (d) {
            chat.lastDone = d;
            if (typeof d.text === 'string') reply.content = d.text;
            reply.meta = {
              reused_positions: d.reused_positions, ring_positions: d.ring_positions, prompt_tokens: d.prompt_tokens,
              tokens_per_s: d.tokens_per_s, finish_reason: d.finish_reason, prefill_ms: d.prefill_ms,
              decode_ms: d.decode_ms, laps: d.laps, lap_ms: d.lap_ms, stages: d.stages, mode: d.mode,
              verified: d.verified, verify_message: d.verify_message, mismatch_position: d.mismatch_position,
            };
          }
          break;
        case 'error':
          finished = true;
          error = (d && d.message) || data || 'The server reported an error.';
          break;
        default:
          break;
      }
    };
    try {
      await D.streamEvents('/api/chat', body, ctrl.signal, onEvent, 'the reply');
      if (!finished) throw new Error('The connection to the server was lost before the reply finished.');
      if (error) throw new Error(error);
      setChatState('');
    } catch (e) {
      if (ctrl.signal.aborted) {
        // Stop: closing the stream ends the turn on the server at its next token.
        reply.meta = { stopped: true, tokens };
        setChatState('stopped after ' + tokens + (tokens === 1 ? ' token' : ' tokens'));
        D.logStatus('chat: stopped by you');
      } else {
        error = e.message;
        D.logStatus('chat error: ' + error, 'error');
        setChatState('');
      }
    } finally {
      chat.abort = null;
      if (reply.content || reply.meta.stopped || (!error && finished)) c.messages.push(reply);
      if (error) c.messages.push({ role: 'error', content: error });
      c.updated = Date.now();
      save();
      setBusy(false);
      renderConversation();
    }
  }

  // ---------- conversations ----------

  function switchTo(id) {
    if (chat.busy) return;
    current().system = $('chat-system').value;
    chat.store.current = id;
    save();
    renderConversation();
  }

  function newChat() {
    if (chat.busy) return;
    const c = current();
    c.system = $('chat-system').value;
    const keepSystem = c.system;
    const fresh = { id: newId(), title: '', system: keepSystem, messages: [], updated: Date.now() };
    // An empty conversation is replaced rather than piled up.
    chat.store.conversations = chat.store.conversations.filter((x) => x.messages.length > 0);
    chat.store.conversations.unshift(fresh);
    chat.store.current = fresh.id;
    save();
    renderConversation();
    $('chat-input').focus();
  }

  function remove(id) {
    if (chat.busy) return;
    chat.store.conversations = chat.store.conversations.filter((x) => x.id !== id);
    const left = chat.store.conversations;
    if (chat.store.current === id) chat.store.current = left.length ? left[0].id : null;
    save();
    renderConversation();
  }

  // ---------- wiring ----------

  $('chat-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const input = $('chat-input');
    const text = input.value;
    if (!text.trim() || chat.busy) return;
    input.value = '';
    send(text);
  });
  $('chat-input').addEventListener('keydown', (e) => {
    // Enter sends; Shift+Enter (and Enter while an input method composes) makes a new line.
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
      e.preventDefault();
      $('chat-form').requestSubmit();
    }
  });
  $('chat-stop').addEventListener('click', () => { if (chat.abort) chat.abort.abort(); });
  $('chat-new').addEventListener('click', newChat);
  $('chat-system').addEventListener('change', () => {
    const c = current();
    c.system = $('chat-system').value;
    save();
  });
  document.addEventListener('daisy:state', (e) => renderMode(e.detail));
  window.addEventListener('storage', (e) => {
    // Another tab changed the conversations: take its copy when idle.
    if (e.key === STORE && !chat.busy) { chat.store = loadStore(); renderConversation(); }
  });

  D.chat = chat;
  D.renderMarkdown = renderMarkdown;
  renderMode(D.ui.state);
  renderConversation();
})();
