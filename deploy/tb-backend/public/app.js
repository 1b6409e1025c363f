// TrickBook DMs in miniature: the browser chat page of the companion demo service.
// Left: the user's conversations (DMs with the AI companions Kaori, Tony, Rico, Max and Zoe, and group
// chats); right: the open conversation with its messages, cards (richContent), a typing indicator and a
// composer. It talks to the same-origin service only: JSON under /api with `Authorization: Bearer <JWT>`,
// and Socket.IO for live messages (replies, follow-ups) and typing. Plain DOM, no framework, no build.
// Message text is untrusted: it only ever reaches the page through textContent / text nodes, and only
// http(s):, tel:, sms: and trickbook: URLs become links.
'use strict';

(() => {
  const TOKEN_KEY = 'tb-demo-token';
  const TYPING_TIMEOUT_MS = 30000;
  const EMOJI = { kaori: '🏔️', tony: '🛹', rico: '🏄', max: '🚲', zoe: '⛷️' };
  const LINK_SCHEMES = ['http:', 'https:', 'tel:', 'sms:', 'trickbook:'];
  const CRISIS_KINDS = {
    counselling: 'someone listens',
    reporting: 'for reporting, not confidential support',
    emergency: 'emergency number: call in danger',
    directory: 'helplines by country',
  };

  const $ = (id) => document.getElementById(id);
  const ui = {
    status: $('status'), me: $('me'), list: $('conversations'), messages: $('messages'),
    typing: $('typing'), composer: $('composer'), input: $('message-input'), send: $('send'),
    title: $('chat-title'), sub: $('chat-sub'), avatar: $('chat-avatar'),
    notice: $('notice'), noticeText: $('notice-text'), noticeClose: $('notice-close'),
  };

  const state = {
    token: null,
    me: null,                 // GET /api/me
    conversations: [],        // GET /api/conversations
    messages: new Map(),      // conversationId -> Map(_id -> message doc)
    unread: new Map(),        // conversationId -> count of live messages while it was not open
    typing: new Map(),        // conversationId -> Map(userId -> timer)
    openId: null,
    ready: false,             // me and the conversation list are loaded
    early: [],                // socket events that arrived before that
    sending: false,
  };

  // ---- small helpers ----------------------------------------------------------------------------

  // Builds an element. Strings among the children become text nodes (never HTML).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === 'class') node.className = v;
      else if (k === 'text') node.textContent = v;
      else node.setAttribute(k, v);
    }
    for (const c of children.flat()) if (c != null && c !== false) node.append(c);
    return node;
  }

  const str = (v) => (typeof v === 'string' && v.trim() ? v.trim() : null);
  const num = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
  const myId = () => state.me && state.me.userId;
  const convById = (id) => state.conversations.find((c) => c._id === id);

  // The URL if it may become an href (an allowed scheme, nothing odd in it), else null.
  function safeHref(raw) {
    const s = str(raw);
    if (!s || !/^[a-z][a-z0-9+.-]*:/i.test(s) || /[\s\u0000-\u001f\u007f<>"'`\\]/.test(s)) return null;
    try {
      const u = new URL(s);
      return LINK_SCHEMES.includes(u.protocol) ? u.href : null;
    } catch {
      return null;
    }
  }

  // A link when the URL is allowed; otherwise the raw URL as plain text; nothing without a URL.
  function link(raw, label, cls) {
    if (!str(raw)) return null;
    const href = safeHref(raw);
    if (!href) return el('span', { class: 'nolink', text: String(raw) });
    const web = /^https?:/i.test(href);
    return el('a', { class: cls, href, target: web ? '_blank' : null, rel: web ? 'noopener noreferrer' : null, text: label || href });
  }

  async function api(path, options = {}) {
    const headers = { Accept: 'application/json', Authorization: `Bearer ${state.token}` };
    if (options.body) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, { ...options, headers });
    let body = null;
    try { body = await res.json(); } catch { /* empty or not JSON */ }
    if (!res.ok) throw new Error((body && str(body.error)) || `${res.status} ${res.statusText}`.trim());
    return body;
  }

  function takeToken() {
    let token = null;
    try {
      const url = new URL(location.href);
      token = url.searchParams.get('token');
      if (token) {
        sessionStorage.setItem(TOKEN_KEY, token);
        url.searchParams.delete('token');
        history.replaceState(history.state, '', url.pathname + url.search + url.hash);
      }
      return token || sessionStorage.getItem(TOKEN_KEY);
    } catch {
      return token;
    }
  }

  function setStatus(kind, text) {
    ui.status.dataset.state = kind;
    ui.status.textContent = text;
  }

  function showNotice(text) {
    ui.noticeText.textContent = text;
    ui.notice.hidden = false;
  }

  const clock = (iso) => {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return '';
    const time = d.toLocaleTimeString([], { hour: 'numeric', minute: '2-digit' });
    return d.toDateString() === new Date().toDateString() ? time : `${d.toLocaleDateString([], { month: 'short', day: 'numeric' })} ${time}`;
  };

  // ---- people, conversations --------------------------------------------------------------------

  const participant = (conv, id) => (conv && Array.isArray(conv.participants) ? conv.participants.find((p) => p._id === id) : null);
  const nameOf = (p) => (p && (str(p.name) || str(p.username))) || 'someone';
  const bots = (conv) => (conv && Array.isArray(conv.participants) ? conv.participants.filter((p) => p.isBot) : []);
  const titleOf = (conv) => str(conv.title) || bots(conv).map(nameOf).join(', ') || 'Conversation';

  function avatar(p) {
    const name = nameOf(p);
    const a = el('span', { class: 'avatar', 'aria-hidden': 'true', text: EMOJI[p && p.username] || name.charAt(0).toUpperCase() });
    let hue = 0;
    for (const ch of name) hue = (hue * 31 + ch.codePointAt(0)) % 360;
    a.style.setProperty('--hue', String(hue));
    return a;
  }

  function convAvatar(conv) {
    const b = bots(conv);
    if (!conv.isGroup || b.length < 2) return avatar(b[0] || conv.participants && conv.participants.find((p) => p._id !== myId()));
    return el('span', { class: 'avatar-pair', 'aria-hidden': 'true' }, avatar(b[0]), avatar(b[1]));
  }

  const compare = (a, b) => (Date.parse(a.timestamp) || 0) - (Date.parse(b.timestamp) || 0) || (a._id < b._id ? -1 : a._id > b._id ? 1 : 0);
  const sortedMessages = (cid) => [...(state.messages.get(cid) || new Map()).values()].sort(compare);
  const lastMessage = (cid) => sortedMessages(cid).pop() || null;

  function typingText(cid) {
    const who = state.typing.get(cid);
    if (!who || !who.size) return '';
    const names = [...who.keys()].map((id) => nameOf(participant(convById(cid), id)));
    return `${names.join(' and ')} ${names.length > 1 ? 'are' : 'is'} typing…`;
  }

  function previewOf(conv, last) {
    if (!last) return conv.isGroup ? `Group · ${bots(conv).length} companions` : 'AI companion · say hi';
    const firstLine = (str(last.content) || '').split('\n')[0];
    const body = firstLine || (last.richContent && str(last.richContent.type) ? `[${last.richContent.type.replace(/_/g, ' ')}]` : '');
    const who = last.senderId === myId() ? 'You: ' : conv.isGroup ? `${nameOf(participant(conv, last.senderId))}: ` : '';
    return who + body;
  }

  function renderConversations() {
    const lastTime = (c) => { const m = lastMessage(c._id); return m ? Date.parse(m.timestamp) || 0 : 0; };
    const items = state.conversations
      .map((c, i) => ({ c, i, t: lastTime(c) }))
      .sort((x, y) => y.t - x.t || x.i - y.i)
      .map(({ c }) => {
        const last = lastMessage(c._id);
        const unread = state.unread.get(c._id) || 0;
        const typing = typingText(c._id);
        const open = c._id === state.openId;
        return el('li', {
          class: `conversation${open ? ' active' : ''}${unread ? ' unread' : ''}`,
          'data-conversation-id': c._id, tabindex: '0', role: 'button', 'aria-current': open ? 'true' : null,
        },
        convAvatar(c),
        el('div', { class: 'conv-body' },
          el('div', { class: 'conv-top' },
            el('span', { class: 'conv-title', text: titleOf(c) }),
            el('span', { class: 'conv-time', text: last ? clock(last.timestamp) : '' })),
          el('div', { class: 'conv-bottom' },
            el('span', { class: `conv-preview${typing ? ' is-typing' : ''}`, text: typing || previewOf(c, last) }),
            unread ? el('span', { class: 'badge', text: String(unread), 'aria-label': `${unread} unread` }) : null)));
      });
    const focused = document.activeElement && document.activeElement.closest && document.activeElement.closest('.conversation');
    ui.list.replaceChildren(...items);
    if (focused) { const again = items.find((i) => i.dataset.conversationId === focused.dataset.conversationId); if (again) again.focus(); }
  }

  function renderHeader() {
    const conv = convById(state.openId);
    if (!conv) return;
    ui.title.textContent = titleOf(conv);
    const others = (conv.participants || []).filter((p) => p._id !== myId()).map(nameOf);
    ui.sub.textContent = conv.isGroup ? `Group · you, ${others.join(', ')}` : 'AI companion · not a real person';
    ui.avatar.replaceWith(ui.avatar = Object.assign(convAvatar(conv), { id: 'chat-avatar' }));
  }

  // ---- messages ---------------------------------------------------------------------------------

  const visible = (m) => !Array.isArray(m.visibleTo) || !m.visibleTo.length || !myId() || m.visibleTo.includes(myId());

  // Stores a message once (by _id); draws it if its conversation is open. True if it was new.
  function addMessage(m) {
    if (!m || typeof m._id !== 'string' || typeof m.conversationId !== 'string' || !visible(m)) return false;
    let box = state.messages.get(m.conversationId);
    if (!box) state.messages.set(m.conversationId, (box = new Map()));
    if (box.has(m._id)) return false;
    box.set(m._id, m);
    if (m.conversationId === state.openId) insertMessageNode(m);
    return true;
  }

  // Text with its http(s) and trickbook links made clickable; everything else stays text.
  function textOf(content) {
    const node = el('div', { class: 'text' });
    const s = typeof content === 'string' ? content : '';
    let at = 0;
    for (const match of s.matchAll(/\b(?:https?|trickbook):\/\/[^\s<>"']+/gi)) {
      const url = match[0].replace(/[.,!?;:)\]]+$/, '');
      node.append(s.slice(at, match.index), link(url, url));
      at = match.index + url.length;
    }
    node.append(s.slice(at));
    return node;
  }

  function messageNode(m) {
    const conv = convById(m.conversationId);
    const mine = m.senderId === myId();
    const cls = ['message', mine ? 'mine' : 'theirs'];
    if (m.proactive) cls.push('proactive');
    if (m.safety === 'crisis') cls.push('crisis');
    const sender = participant(conv, m.senderId);
    const col = el('div', { class: 'col' },
      mine ? null : el('div', { class: 'sender', text: nameOf(sender) }),
      m.proactive ? el('div', { class: 'tag', text: m.trigger && m.trigger.kind === 'spot_review' ? '↻ spot review update' : '↻ follow-up' }) : null,
      el('div', { class: 'bubble' }, textOf(m.content)),
      m.richContent && typeof m.richContent === 'object' ? card(m.richContent) : null,
      el('time', { class: 'time', datetime: str(m.timestamp), text: clock(m.timestamp) }));
    return el('div', { class: cls.join(' '), 'data-message-id': m._id, 'data-sender-id': m.senderId }, mine ? null : avatar(sender), col);
  }

  const nearBottom = () => ui.messages.scrollHeight - ui.messages.scrollTop - ui.messages.clientHeight < 120;
  const scrollDown = () => { ui.messages.scrollTop = ui.messages.scrollHeight; };

  function insertMessageNode(m) {
    const stick = nearBottom() || m.senderId === myId();
    const box = state.messages.get(m.conversationId);
    const before = [...ui.messages.querySelectorAll('.message')]
      .find((n) => box.has(n.dataset.messageId) && compare(m, box.get(n.dataset.messageId)) < 0);
    ui.messages.insertBefore(messageNode(m), before || null);
    const empty = ui.messages.querySelector('.empty');
    if (empty) empty.remove();
    if (stick) scrollDown();
  }

  function renderMessages() {
    const list = sortedMessages(state.openId);
    const conv = convById(state.openId);
    const hello = conv ? `Say hi to ${conv.isGroup ? 'the crew' : titleOf(conv)} 👋` : 'Pick a conversation';
    ui.messages.replaceChildren(...(list.length ? list.map(messageNode) : [el('div', { class: 'empty', text: hello })]));
    scrollDown();
  }

  // ---- cards (richContent) ----------------------------------------------------------------------

  const head = (kicker, title) => [el('div', { class: 'card-kicker', text: kicker }), el('div', { class: 'card-title', text: title })];
  const meta = (parts) => { const t = parts.filter(Boolean).join(' · '); return t ? el('div', { class: 'card-meta', text: t }) : null; };
  const actions = (...links) => { const l = links.filter(Boolean); return l.length ? el('div', { class: 'card-actions' }, l) : null; };
  const place = (d) => [str(d.city), str(d.state), str(d.country)].filter(Boolean).join(', ');
  const rating = (d) => (num(d.rating) != null ? `★ ${num(d.rating).toFixed(1)}` : null);
  const count = (n, word) => (num(n) != null ? `${n} ${word}${n === 1 ? '' : 's'}` : null);

  const CARDS = {
    tricklist_card: (d) => [head('Tricklist', str(d.name) || 'Untitled list'),
      meta([count(d.trickCount, 'trick'), str(d.category)]), actions(link(d.deepLink, 'Open tricklist', 'btn'))],
    trick_card: (d) => [head(['Trick', str(d.category)].filter(Boolean).join(' · '), str(d.name) || 'Trick'),
      meta([str(d.difficulty)]), actions(link(d.deepLink, 'Open trick', 'btn'))],
    spot_card: (d) => [head(str(d.type) || 'Spot', str(d.name) || 'Spot'),
      meta([place(d), rating(d)]), actions(link(d.deepLink, 'Open spot', 'btn'))],
    spots_list: (d) => {
      const spots = (Array.isArray(d) ? d : Array.isArray(d.spots) ? d.spots : []).filter((s) => s && typeof s === 'object');
      return [el('div', { class: 'card-kicker', text: count(spots.length, 'spot') }),
        el('ul', { class: 'spot-rows' }, spots.map((s) => el('li', { class: 'spot-row' },
          el('div', {}, el('div', { class: 'spot-name', text: str(s.name) || 'Spot' }),
            meta([str(s.type), place(s), rating(s)])),
          link(s.deepLink, 'Open', 'btn small'))))];
    },
    spot_draft_confirmation: (d) => [head('Spot submitted', str(d.name) || 'New spot'), meta([place(d)]),
      el('div', { class: 'card-note' },
        el('span', { class: 'chip', text: (str(d.status) || 'pending_approval').replace(/_/g, ' ') }),
        ' a moderator checks it before it goes live')],
    crisis_resources: crisisCard,
  };

  function card(rc) {
    const type = str(rc.type) || 'unknown';
    const known = Object.prototype.hasOwnProperty.call(CARDS, type);
    const node = el('div', { class: `card ${known ? `card-${type}` : 'card-generic'}`, 'data-card-type': type });
    const data = rc.data && typeof rc.data === 'object' ? rc.data : {};
    try {
      if (!known) throw new Error('unknown card');
      node.append(...[CARDS[type](data)].flat(2).filter(Boolean));
    } catch {
      node.replaceChildren(el('div', { class: 'card-kicker', text: 'card' }), el('div', { class: 'card-title', text: type.replace(/_/g, ' ') }));
    }
    return node;
  }

  function regionName(code) {
    try { return new Intl.DisplayNames(['en'], { type: 'region' }).of(code) || code; } catch { return code; }
  }

  // docs/tb-backend.md "The crisis card": the lines in the order given, each one tap away.
  function crisisCard(d) {
    const country = str(d.country);
    const lang = str(d.lang);
    const lines = (Array.isArray(d.lines) ? d.lines : []).filter((l) => l && typeof l === 'object');
    return [
      head('Talk to a real person', country ? `Help in ${regionName(country)}` : 'Find a helpline near you'),
      el('ul', { class: 'crisis-lines', lang: lang && /^[a-z]{2,3}(-[a-z0-9]+)*$/i.test(lang) ? lang : null }, lines.map(crisisLine)),
    ];
  }

  function crisisLine(l) {
    const kind = Object.prototype.hasOwnProperty.call(CRISIS_KINDS, l.kind) ? l.kind : 'counselling';
    const hours = str(l.hours);
    const cost = str(l.cost);
    const phone = str(l.phone);
    const text = str(l.text);
    const dial = (s) => s.replace(/(?!^\+)[^\d]/g, '');
    let sms = null;
    if (text) {
      const kw = /^(\S+)\s+to\s+(\+?[\d\s-]+)$/i.exec(text);
      sms = kw
        ? link(`sms:${dial(kw[2])}?body=${encodeURIComponent(kw[1])}`, `Text ${kw[1]} to ${kw[2].trim()}`, 'btn')
        : link(`sms:${dial(text)}`, `Text ${text}`, 'btn');
    }
    let site = null;
    if (str(l.url)) {
      let host = str(l.url);
      try { host = new URL(host).host.replace(/^www\./, ''); } catch { /* shown as given */ }
      site = link(l.url, `${host} ↗`, 'btn ghost');
    }
    return el('li', { class: 'crisis-line', 'data-kind': kind },
      el('div', { class: 'line-name', text: str(l.name) || 'Helpline' }),
      el('div', { class: 'line-tags' },
        el('span', { class: `chip kind kind-${kind}`, text: CRISIS_KINDS[kind] }),
        hours ? el('span', { class: 'chip', text: hours === '24/7' ? '24/7' : `open ${hours}` }) : null,
        cost === 'free' ? el('span', { class: 'chip', text: 'free' }) : null),
      cost && cost !== 'free' ? el('div', { class: 'line-cost', text: `cost: ${cost}` }) : null,
      actions(phone ? link(`tel:${dial(phone)}`, `Call ${phone}`, 'btn call') : null, sms, site));
  }

  // ---- typing -----------------------------------------------------------------------------------

  function setTyping(cid, uid, on) {
    if (typeof cid !== 'string' || typeof uid !== 'string' || uid === myId()) return;
    let who = state.typing.get(cid);
    if (!who) state.typing.set(cid, (who = new Map()));
    clearTimeout(who.get(uid));
    who.delete(uid);
    if (on) who.set(uid, setTimeout(() => setTyping(cid, uid, false), TYPING_TIMEOUT_MS));
    renderTyping();
    renderConversations();
  }

  function renderTyping() {
    const text = typingText(state.openId);
    ui.typing.replaceChildren(...(text ? [el('span', { class: 'dots', 'aria-hidden': 'true' }, el('i'), el('i'), el('i')), text] : []));
    ui.typing.hidden = !text;
  }

  // ---- loading, opening, sending ----------------------------------------------------------------

  async function loadConversations() {
    const list = await api('/api/conversations');
    state.conversations = (Array.isArray(list) ? list : []).filter((c) => c && typeof c._id === 'string');
    renderConversations();
    if (state.openId) renderHeader();
  }

  async function loadMessages(cid) {
    const list = await api(`/api/conversations/${encodeURIComponent(cid)}/messages?limit=50`);
    for (const m of Array.isArray(list) ? list : []) addMessage(m);
    renderConversations();
  }

  function openConversation(cid) {
    if (!convById(cid)) return;
    state.openId = cid;
    state.unread.delete(cid);
    renderHeader();
    renderMessages();
    renderTyping();
    renderConversations();
    updateSend();
    loadMessages(cid).catch((e) => showNotice(e.message));
  }

  function onNewMessage(m) {
    if (!m || typeof m.conversationId !== 'string') return;
    setTyping(m.conversationId, m.senderId, false);
    if (!addMessage(m)) return;
    if (m.conversationId !== state.openId && m.senderId !== myId()) {
      state.unread.set(m.conversationId, (state.unread.get(m.conversationId) || 0) + 1);
    }
    if (!convById(m.conversationId)) loadConversations().catch((e) => showNotice(e.message));
    renderConversations();
  }

  // After a reconnect: what arrived while the socket was down.
  function resync() {
    loadConversations().catch((e) => showNotice(e.message));
    if (state.openId) loadMessages(state.openId).catch((e) => showNotice(e.message));
  }

  function updateSend() {
    ui.send.disabled = state.sending || !state.openId || !ui.input.value.trim();
  }

  function autosize() {
    ui.input.style.height = 'auto';
    const h = ui.input.scrollHeight + 2; // + the borders (border-box)
    ui.input.style.height = `${Math.min(h, 160)}px`;
    ui.input.style.overflowY = h > 160 ? 'auto' : 'hidden';
  }

  async function send(e) {
    e.preventDefault();
    const content = ui.input.value.trim();
    const cid = state.openId;
    if (!content || !cid || state.sending) return;
    state.sending = true;
    ui.input.value = '';
    autosize();
    updateSend();
    try {
      const m = await api(`/api/conversations/${encodeURIComponent(cid)}/messages`, { method: 'POST', body: JSON.stringify({ content }) });
      if (addMessage(m)) renderConversations();
      ui.notice.hidden = true;
    } catch (err) {
      if (!ui.input.value) ui.input.value = content;
      autosize();
      showNotice(err.message);
    } finally {
      state.sending = false;
      updateSend();
    }
  }

  function connectSocket() {
    if (typeof window.io !== 'function') {
      setStatus('error', 'no Socket.IO client: is the service running?');
      return;
    }
    const socket = window.io({ auth: { token: state.token } });
    let missed = false; // something may have been missed: refetch on the next "connect"
    const when = (fn) => (arg) => (state.ready ? fn(arg) : state.early.push(() => fn(arg)));
    socket.on('connect', () => {
      setStatus('ok', 'connected');
      if (missed && state.ready) resync();
      missed = false;
    });
    socket.on('disconnect', (reason) => {
      missed = true;
      setStatus('warn', reason === 'io server disconnect' ? 'disconnected' : 'reconnecting…');
    });
    socket.on('connect_error', (err) => {
      missed = true;
      setStatus('error', (err && str(err.message)) || 'connection failed');
    });
    socket.on('new_message', when(onNewMessage));
    socket.on('typing', when((t) => t && setTyping(t.conversationId, t.userId, !!t.isTyping)));
  }

  function showNoToken() {
    setStatus('error', 'no token');
    ui.title.textContent = 'Not signed in';
    ui.messages.replaceChildren(el('div', { class: 'empty no-token' },
      el('strong', { text: 'no token: open the link the demo printed' }),
      el('div', { text: 'The page needs ?token=… in its address once; it keeps it for this tab.' })));
    ui.input.disabled = true;
  }

  async function start() {
    ui.noticeClose.addEventListener('click', () => { ui.notice.hidden = true; });
    state.token = takeToken();
    if (!state.token) return showNoToken();
    setStatus('pending', 'connecting…');
    connectSocket();

    ui.composer.addEventListener('submit', send);
    ui.input.addEventListener('input', () => { autosize(); updateSend(); });
    ui.input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); ui.composer.requestSubmit(); }
    });
    const pick = (e) => { const item = e.target.closest('.conversation'); if (item) openConversation(item.dataset.conversationId); };
    ui.list.addEventListener('click', pick);
    ui.list.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); pick(e); } });

    try {
      state.me = await api('/api/me');
      ui.me.textContent = [str(state.me.name), str(state.me.username) && `@${state.me.username}`].filter(Boolean).join(' · ');
      await loadConversations();
    } catch (err) {
      showNotice(err.message);
      ui.title.textContent = 'Could not load';
      return;
    }
    state.ready = true;
    state.early.splice(0).forEach((fn) => fn());
    if (state.conversations.length) openConversation(state.conversations[0]._id);
    else ui.messages.replaceChildren(el('div', { class: 'empty', text: 'No conversations yet' }));
    // Fill the other conversations' previews.
    for (const c of state.conversations) if (c._id !== state.openId) loadMessages(c._id).catch(() => {});
  }

  start();
})();
