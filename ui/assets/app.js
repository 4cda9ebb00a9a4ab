// esf web view: groups, a group's search tree on a canvas, a node's record,
// the diff of two nodes, a node's files. Plain JS, no build step, nothing
// from the network: every request goes to the esfctl ui server that
// served this page (its cookie carries the token).
'use strict';

(function () {
  const $ = (sel) => document.querySelector(sel);

  // h builds an element: h('a', {href: x}, 'text', child, ...). Text is
  // always a text node, never HTML.
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'class') el.className = v;
      else el.setAttribute(k, v === true ? '' : v);
    }
    for (const k of kids.flat()) {
      if (k === undefined || k === null || k === false) continue;
      el.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return el;
  }

  async function getJSON(url) {
    const r = await fetch(url, { credentials: 'same-origin' });
    const body = await r.json().catch(() => null);
    if (!r.ok) throw new Error(errText(r, body));
    return body;
  }
  async function postJSON(url, data) {
    const r = await fetch(url, {
      method: 'POST', credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', 'X-Esf-UI': '1' }, body: JSON.stringify(data),
    });
    const body = await r.json().catch(() => null);
    if (!r.ok) throw new Error(errText(r, body));
    return body;
  }
  function errText(r, body) {
    if (body && body.error) return body.error.code + ': ' + body.error.message;
    return r.status + ' ' + r.statusText;
  }

  let toastTimer = 0;
  function toast(msg) {
    const t = $('#toast');
    t.textContent = msg;
    t.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { t.hidden = true; }, 6000);
  }

  function shortID(id) {
    const i = id.indexOf('_');
    const s = i >= 0 ? id.slice(i + 1) : id;
    return s.length > 8 ? s.slice(-8) : s;
  }
  function num(v) {
    if (v === undefined || v === null) return '';
    return Number.isInteger(v) ? String(v) : v.toFixed(3);
  }
  function copyButton(text) {
    return h('button', {
      class: 'copy', type: 'button', title: 'copy', 'aria-label': 'copy ' + text,
      onclick: () => {
        if (navigator.clipboard) navigator.clipboard.writeText(text).then(() => toast('copied ' + text), () => toast(text));
        else toast(text);
      },
    }, 'copy');
  }
  function idCell(id, href) {
    return h('span', { class: 'id' }, href ? h('a', { href }, id) : id, copyButton(id));
  }

  // ---- state -------------------------------------------------------------

  const S = {
    route: { view: 'groups' },
    groups: [],
    tree: null,       // the /api/tree answer
    model: null,      // built from tree
    view: { scale: 1, tx: 40, ty: 40, fitted: false },
    collapsed: new Set(),
    selected: null,   // node id with the keyboard focus / open panel
    diffA: null, diffB: null,
    files: { id: null, path: '' },
    tab: 'node',
    drawn: [],
    lastRender: null,
    renders: 0,
    live: false,
  };

  // ---- routing -----------------------------------------------------------

  function parseHash() {
    const p = location.hash.replace(/^#\/?/, '').split('/').filter(Boolean).map(decodeURIComponent);
    if (p[0] === 'g' && p[1]) return { view: 'tree', group: p[1], node: p[2] === 'n' ? p[3] : null };
    return { view: 'groups' };
  }
  function go(route) {
    let hash = '#/';
    if (route.view === 'tree') {
      hash = '#/g/' + encodeURIComponent(route.group);
      if (route.node) hash += '/n/' + encodeURIComponent(route.node);
    }
    if (location.hash !== hash) location.hash = hash;
    else onRoute();
  }
  async function onRoute() {
    const r = parseHash();
    const groupChanged = r.group !== S.route.group || r.view !== S.route.view;
    S.route = r;
    $('#groups-view').hidden = r.view !== 'groups';
    $('#tree-view').hidden = r.view !== 'tree';
    crumbs();
    if (r.view === 'groups') {
      $('#panel').hidden = true;
      await loadGroups();
      return;
    }
    if (!r.node) $('#panel').hidden = true; // before the fit: the canvas takes the room
    if (groupChanged) {
      S.tree = null; S.model = null; S.collapsed.clear(); S.view.fitted = false;
      S.diffA = S.diffB = null;
      await loadTree();
    }
    if (r.node) select(r.node, { route: false, center: groupChanged });
    else { S.selected = null; $('#panel').hidden = true; draw(); }
  }
  function crumbs() {
    const c = $('#crumbs');
    c.replaceChildren(h('a', { href: '#/' }, 'groups'));
    if (S.route.group) c.append(' / ', h('a', { href: '#/g/' + S.route.group }, S.route.group));
    if (S.route.node) c.append(' / ', S.route.node);
  }

  // ---- groups view -------------------------------------------------------

  async function loadGroups() {
    let res;
    try { res = await getJSON('/api/groups'); } catch (e) { toast('groups: ' + e.message); return; }
    S.groups = res.groups;
    const tb = $('#groups tbody');
    tb.replaceChildren(...res.groups.map((g) => h('tr', { 'data-group': g.group_id },
      h('td', {}, idCell(g.group_id, '#/g/' + g.group_id)),
      h('td', { class: 'nodes' }, g.nodes),
      h('td', {}, idCell(g.canonical_node_id, '#/g/' + g.group_id + '/n/' + g.canonical_node_id)),
      h('td', { class: 'generation' }, g.generation),
      h('td', { class: 'live-attempts' }, g.live_attempts),
      h('td', {}, new Date(g.created_at).toLocaleString()),
    )));
    $('#groups-empty').hidden = res.groups.length > 0;
    if (res.error) toast('event log: ' + res.error);
  }

  // ---- tree model and layout --------------------------------------------

  const XGAP = 64, YGAP = 90, R = 9;

  function buildModel(resp) {
    const byId = new Map();
    for (const n of resp.nodes) byId.set(n.node_id, { n, kids: [], parent: null, x: 0, y: 0, depth: 0, shown: false });
    const roots = [];
    for (const m of byId.values()) {
      const p = m.n.parents && m.n.parents.length ? byId.get(m.n.parents[0]) : null;
      if (p) { p.kids.push(m); m.parent = p; } else roots.push(m);
    }
    const order = (a, b) => (a.n.created_at < b.n.created_at ? -1 : a.n.created_at > b.n.created_at ? 1 : a.n.node_id < b.n.node_id ? -1 : 1);
    for (const m of byId.values()) if (m.kids.length > 1) m.kids.sort(order);
    roots.sort((a, b) => (a.n.node_id === resp.group.root_node_id ? -1 : b.n.node_id === resp.group.root_node_id ? 1 : order(a, b)));
    return { byId, roots, shown: [] };
  }

  // layout places the nodes not hidden by a collapse: leaves on
  // consecutive slots in depth-first order, each parent above the middle of
  // its children. A wide fan-out of leaves (a search's many drafts) wraps
  // into rows under its parent, so a fitted view of 10,000 children still
  // shows them. Iterative: a chain of seals may be very deep.
  const WRAP = 32;
  function layout() {
    const M = S.model;
    const open = (m) => m.kids.length && !S.collapsed.has(m.n.node_id);
    for (const m of M.byId.values()) { m.shown = false; m.grid = 0; m.row = 0; }
    const pre = [];
    const stack = [];
    for (let i = M.roots.length - 1; i >= 0; i--) stack.push([M.roots[i], 0, 0]);
    while (stack.length) {
      const [m, d, idx] = stack.pop();
      m.depth = d; m.shown = true; m.idx = idx;
      pre.push(m);
      if (!open(m)) continue;
      if (m.kids.length > WRAP && m.kids.every((k) => !open(k))) m.grid = Math.ceil(Math.sqrt(m.kids.length * 3));
      for (let i = m.kids.length - 1; i >= 0; i--) stack.push([m.kids[i], d + 1, i]);
    }
    let slot = 0;
    for (const m of pre) {
      m.y = m.depth * YGAP;
      if (open(m)) continue;
      const p = m.parent;
      if (p && p.grid) {
        if (m.idx === 0) p.gridStart = slot;
        const col = m.idx % p.grid, row = Math.floor(m.idx / p.grid);
        m.x = (p.gridStart + col) * XGAP;
        m.y = (m.depth + row * 0.5) * YGAP;
        m.row = row;
        if (m.idx === p.kids.length - 1) slot = p.gridStart + p.grid;
        continue;
      }
      m.row = 0;
      m.x = (slot++) * XGAP;
    }
    for (let i = pre.length - 1; i >= 0; i--) {
      const m = pre[i];
      if (!open(m)) continue;
      m.x = m.grid ? (m.gridStart + (Math.min(m.grid, m.kids.length) - 1) / 2) * XGAP : (m.kids[0].x + m.kids[m.kids.length - 1].x) / 2;
    }
    M.shown = pre;
    M.width = Math.max(1, slot - 1) * XGAP;
    M.height = pre.reduce((a, m) => Math.max(a, m.y), 0);
  }

  async function loadTree() {
    const g = S.route.group;
    const t0 = performance.now();
    let resp;
    try { resp = await getJSON('/api/tree/' + encodeURIComponent(g)); } catch (e) { toast('tree: ' + e.message); return; }
    if (S.route.group !== g) return;
    const t1 = performance.now();
    S.tree = resp;
    S.model = buildModel(resp);
    layout();
    const t2 = performance.now();
    if (!S.view.fitted) { fit(); S.view.fitted = true; }
    drawNow();
    const t3 = performance.now();
    await new Promise((res) => requestAnimationFrame(() => res()));
    const t4 = performance.now();
    S.renders++;
    S.lastRender = { group: g, nodes: resp.nodes.length, fetch_ms: t1 - t0, layout_ms: t2 - t1, draw_ms: t3 - t2, frame_ms: t4 - t3, total_ms: t4 - t0, seq: S.renders };
    $('#tree-info').textContent = resp.nodes.length + ' nodes · generation ' + resp.group.generation +
      ' · drawn in ' + Math.round(t4 - t0) + ' ms';
    crumbs();
  }

  // ---- canvas ------------------------------------------------------------

  const canvas = $('#tree');
  const ctx = canvas.getContext('2d');
  const css = getComputedStyle(document.documentElement);
  const colour = (name) => css.getPropertyValue('--' + name).trim();
  const FILL = { draft: colour('draft'), sealed: colour('sealed'), terminal: colour('terminal'), pruned: colour('pruned') };

  function size() {
    const r = canvas.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(r.width * dpr)), hgt = Math.max(1, Math.round(r.height * dpr));
    if (canvas.width !== w || canvas.height !== hgt) { canvas.width = w; canvas.height = hgt; }
    return { w: r.width, h: r.height, dpr };
  }

  function fit() {
    if (!S.model) return;
    const { w, h: hh } = size();
    const M = S.model;
    const sx = (w - 80) / Math.max(M.width, 1), sy = (hh - 80) / Math.max(M.height, 1);
    S.view.scale = Math.min(1.5, Math.max(1e-4, Math.min(sx, sy)));
    S.view.tx = (w - M.width * S.view.scale) / 2;
    S.view.ty = Math.max(40, (hh - M.height * S.view.scale) / 2);
  }

  const toScreen = (m) => [m.x * S.view.scale + S.view.tx, m.y * S.view.scale + S.view.ty];

  let drawQueued = false;
  function draw() {
    if (drawQueued) return;
    drawQueued = true;
    requestAnimationFrame(() => { drawQueued = false; drawNow(); });
  }

  function drawNow() {
    const { w, h: hh, dpr } = size();
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, hh);
    const M = S.model;
    S.drawn = [];
    if (!M) return;
    const sc = S.view.scale;
    const r = Math.max(1.5, R * Math.min(sc, 1.5));
    const inView = (x, y) => x >= -20 && y >= -20 && x <= w + 20 && y <= hh + 20;
    const canon = S.tree.group.canonical_node_id;
    // Edges.
    ctx.strokeStyle = '#718096';
    ctx.lineWidth = 1;
    ctx.beginPath();
    for (const m of M.shown) {
      if (!m.parent || m.row > 0) continue; // a wrapped fan-out: edges to its first row only
      const [x1, y1] = toScreen(m.parent), [x2, y2] = toScreen(m);
      if (Math.max(x1, x2) < -20 || Math.min(x1, x2) > w + 20 || Math.max(y1, y2) < -20 || Math.min(y1, y2) > hh + 20) continue;
      ctx.moveTo(x1, y1 + r); ctx.lineTo(x2, y2 - r);
    }
    ctx.stroke();
    // Nodes, one path per status.
    const byStatus = {};
    for (const m of M.shown) {
      const [x, y] = toScreen(m);
      const st = m.n.status;
      const vis = inView(x, y);
      S.drawn.push({ id: m.n.node_id, status: st, fill: FILL[st] || '#000', canonical: m.n.node_id === canon,
        dimmed: st === 'pruned', collapsed: S.collapsed.has(m.n.node_id), x, y, r, visible: vis });
      if (!vis) continue;
      (byStatus[st] = byStatus[st] || []).push([x, y]);
    }
    for (const [st, pts] of Object.entries(byStatus)) {
      ctx.globalAlpha = st === 'pruned' ? 0.35 : 1;
      ctx.fillStyle = FILL[st] || '#000';
      ctx.beginPath();
      for (const [x, y] of pts) { ctx.moveTo(x + r, y); ctx.arc(x, y, r, 0, 2 * Math.PI); }
      ctx.fill();
    }
    ctx.globalAlpha = 1;
    // Marks: canonical ring, collapsed plus, selection and diff rings.
    const ring = (id, style, width, extra) => {
      const m = M.byId.get(id);
      if (!m || !m.shown) return;
      const [x, y] = toScreen(m);
      ctx.strokeStyle = style; ctx.lineWidth = width;
      ctx.beginPath(); ctx.arc(x, y, r + extra, 0, 2 * Math.PI); ctx.stroke();
    };
    ring(canon, colour('canonical'), 3, 3);
    for (const id of S.collapsed) {
      const m = M.byId.get(id);
      if (!m || !m.shown) continue;
      const [x, y] = toScreen(m);
      ctx.fillStyle = '#111827';
      ctx.font = 'bold 12px system-ui';
      ctx.fillText('+' + countBelow(m), x + r + 4, y + 4);
    }
    if (S.diffA) ring(S.diffA, '#0f766e', 2, 7);
    if (S.diffB) ring(S.diffB, '#0f766e', 2, 7);
    if (S.selected) ring(S.selected, colour('sel'), 3, 6);
    // Labels once there is room for them.
    if (sc * XGAP >= 56) {
      ctx.font = '11px ui-monospace, monospace';
      ctx.fillStyle = '#1a202c';
      ctx.textAlign = 'center';
      for (const d of S.drawn) {
        if (!d.visible) continue;
        const m = M.byId.get(d.id);
        const rw = S.tree.rewards[d.id];
        ctx.fillText((d.canonical ? '★ ' : '') + shortID(d.id), d.x, d.y + r + 13);
        const stats = 'v' + m.n.visits + ' ' + num(m.n.value) + (rw !== undefined ? ' r' + num(rw) : '');
        ctx.fillText(stats, d.x, d.y + r + 26);
      }
      ctx.textAlign = 'start';
    }
  }

  function countBelow(m) {
    let n = 0;
    const st = [...m.kids];
    while (st.length) { const k = st.pop(); n++; st.push(...k.kids); }
    return n;
  }

  function hit(px, py) {
    let best = null, bd = Infinity;
    for (const d of S.drawn) {
      if (!d.visible) continue;
      const dd = (d.x - px) ** 2 + (d.y - py) ** 2;
      if (dd < bd) { bd = dd; best = d; }
    }
    return best && bd <= (best.r + 6) ** 2 ? best.id : null;
  }

  function zoomAt(f, px, py) {
    const v = S.view;
    const ns = Math.min(4, Math.max(1e-4, v.scale * f));
    v.tx = px - (px - v.tx) * (ns / v.scale);
    v.ty = py - (py - v.ty) * (ns / v.scale);
    v.scale = ns;
    draw();
  }

  function center(id) {
    const m = S.model && S.model.byId.get(id);
    if (!m) return;
    // Open collapsed ancestors first.
    let changed = false;
    for (let p = m.parent; p; p = p.parent) if (S.collapsed.delete(p.n.node_id)) changed = true;
    if (changed) layout();
    const { w, h: hh } = size();
    if (S.view.scale * XGAP < 64) S.view.scale = 64 / XGAP;
    S.view.tx = w / 2 - m.x * S.view.scale;
    S.view.ty = hh / 2 - m.y * S.view.scale;
    draw();
  }

  let drag = null;
  canvas.addEventListener('pointerdown', (e) => {
    canvas.setPointerCapture(e.pointerId);
    drag = { x: e.clientX, y: e.clientY, tx: S.view.tx, ty: S.view.ty, moved: false };
  });
  canvas.addEventListener('pointermove', (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 4) drag.moved = true;
    if (drag.moved) { S.view.tx = drag.tx + dx; S.view.ty = drag.ty + dy; draw(); }
  });
  canvas.addEventListener('pointerup', (e) => {
    const d = drag;
    drag = null;
    if (!d || d.moved) return;
    const rect = canvas.getBoundingClientRect();
    const id = hit(e.clientX - rect.left, e.clientY - rect.top);
    if (!id) return;
    canvas.focus();
    if (e.shiftKey && S.selected && S.selected !== id) openDiff(S.selected, id);
    else select(id);
  });
  canvas.addEventListener('dblclick', (e) => {
    const rect = canvas.getBoundingClientRect();
    const id = hit(e.clientX - rect.left, e.clientY - rect.top);
    if (id) toggleCollapse(id);
  });
  canvas.addEventListener('wheel', (e) => {
    e.preventDefault();
    const rect = canvas.getBoundingClientRect();
    zoomAt(Math.exp(-e.deltaY * 0.0015), e.clientX - rect.left, e.clientY - rect.top);
  }, { passive: false });
  // A resize (the panel opening, the window) keeps what was at the centre
  // at the centre.
  let lastSize = null;
  new ResizeObserver(() => {
    const r = canvas.getBoundingClientRect();
    if (lastSize && S.model) {
      S.view.tx += (r.width - lastSize.w) / 2;
      S.view.ty += (r.height - lastSize.h) / 2;
    }
    lastSize = { w: r.width, h: r.height };
    draw();
  }).observe(canvas);

  function toggleCollapse(id) {
    const m = S.model && S.model.byId.get(id);
    if (!m || !m.kids.length) return;
    if (!S.collapsed.delete(id)) S.collapsed.add(id);
    layout();
    draw();
  }

  canvas.addEventListener('keydown', (e) => {
    if (!S.model) return;
    const cur = S.selected && S.model.byId.get(S.selected);
    const pick = (m) => { if (m) { e.preventDefault(); select(m.n.node_id); } };
    const siblings = (m) => (m.parent ? m.parent.kids : S.model.roots);
    const { w, h: hh } = size();
    switch (e.key) {
      case 'ArrowUp': pick(cur ? cur.parent : S.model.roots[0]); break;
      case 'ArrowDown':
        if (!cur) pick(S.model.roots[0]);
        else if (cur.kids.length && !S.collapsed.has(cur.n.node_id)) pick(cur.kids[Math.floor((cur.kids.length - 1) / 2)]);
        break;
      case 'ArrowLeft': case 'ArrowRight': {
        if (!cur) { pick(S.model.roots[0]); break; }
        const sib = siblings(cur);
        const i = sib.indexOf(cur) + (e.key === 'ArrowLeft' ? -1 : 1);
        pick(sib[i]);
        break;
      }
      case 'Enter': if (cur) { e.preventDefault(); showTab('node'); } break;
      case ' ': if (cur) { e.preventDefault(); toggleCollapse(cur.n.node_id); } break;
      case '/': e.preventDefault(); $('#search-id').focus(); break;
      case 'f': fit(); draw(); break;
      case '+': case '=': zoomAt(1.25, w / 2, hh / 2); break;
      case '-': zoomAt(0.8, w / 2, hh / 2); break;
      case 'd': if (cur && cur.parent) openDiff(cur.parent.n.node_id, cur.n.node_id); break;
      case 'Escape': $('#panel').hidden = true; break;
    }
  });

  $('#fit').addEventListener('click', () => { fit(); draw(); });
  $('#zoom-in').addEventListener('click', () => { const { w, h: hh } = size(); zoomAt(1.25, w / 2, hh / 2); });
  $('#zoom-out').addEventListener('click', () => { const { w, h: hh } = size(); zoomAt(0.8, w / 2, hh / 2); });
  $('#search').addEventListener('submit', (e) => {
    e.preventDefault();
    const q = $('#search-id').value.trim();
    if (!q || !S.model) return;
    let found = S.model.byId.has(q) ? q : null;
    if (!found) for (const id of S.model.byId.keys()) if (id.endsWith(q) || id.includes(q)) { found = id; break; }
    if (!found) { toast('no node matches ' + q); return; }
    select(found, { center: true });
    canvas.focus();
  });

  // ---- panel -------------------------------------------------------------

  function showTab(tab) {
    S.tab = tab;
    $('#panel').hidden = false;
    for (const t of ['node', 'files', 'diff']) {
      $('#pane-' + t).hidden = t !== tab;
      $('#tab-' + t).setAttribute('aria-selected', String(t === tab));
    }
    if (tab === 'files') loadFiles();
  }
  for (const b of document.querySelectorAll('.tabs [data-tab]')) b.addEventListener('click', () => showTab(b.dataset.tab));
  $('#panel-close').addEventListener('click', () => { $('#panel').hidden = true; });

  function select(id, opt) {
    opt = opt || {};
    S.selected = id;
    if (opt.route !== false) {
      S.route.node = id;
      history.replaceState(null, '', '#/g/' + encodeURIComponent(S.route.group) + '/n/' + encodeURIComponent(id));
      crumbs();
    }
    if (opt.center) center(id);
    else {
      const d = S.drawn.find((x) => x.id === id);
      if (d && !d.visible) center(id); else draw();
    }
    if (S.files.node !== id) S.files = { node: id, id: null, path: '' };
    if (S.tab === 'diff') S.tab = 'node';
    showTab(S.tab);
    loadNode(id);
  }

  const sect = (title, ...kids) => [h('h3', {}, title), ...kids];

  async function loadNode(id) {
    let v;
    try { v = await getJSON('/api/inspect/' + encodeURIComponent(id)); } catch (e) { toast('inspect: ' + e.message); return; }
    if (S.selected !== id) return;
    const n = v.node;
    const g = S.tree ? S.tree.group : null;
    const canonical = g && g.canonical_node_id === n.node_id;
    const reward = S.tree ? S.tree.rewards[n.node_id] : undefined;
    const pane = $('#pane-node');
    const link = (nid) => h('li', {}, idCell(nid, '#/g/' + n.group_id + '/n/' + nid));
    const attempts = await Promise.all((n.attempts || []).slice(-10).map((a) =>
      getJSON('/api/inspect/' + encodeURIComponent(a)).then((x) => x.attempt, () => ({ attempt_id: a, state: '?' }))));
    if (S.selected !== id) return;
    const gen = g ? g.generation : 0;
    pane.replaceChildren(...[
      h('h2', {}, h('span', { class: 'id', id: 'node-id' }, n.node_id), copyButton(n.node_id)),
      h('dl', { class: 'kv' },
        h('dt', {}, 'status'), h('dd', {}, h('span', { class: 'status ' + n.status, id: 'node-status' }, n.status),
          canonical ? h('strong', { id: 'node-canonical' }, ' ★ canonical (generation ' + gen + ')') : ''),
        h('dt', {}, 'group'), h('dd', {}, idCell(n.group_id, '#/g/' + n.group_id)),
        h('dt', {}, 'root'), h('dd', {}, idCell(n.root_id)),
        h('dt', {}, 'visits / value'), h('dd', {}, n.visits + ' / ' + num(n.value)),
        h('dt', {}, 'reward (newest)'), h('dd', {}, reward === undefined ? '—' : num(reward)),
        h('dt', {}, 'created'), h('dd', {}, new Date(n.created_at).toLocaleString()),
      ),
      sect('Actions',
        h('div', { class: 'actions' },
          h('label', {}, 'n ', h('input', { id: 'fork-n', type: 'number', min: 1, max: 10000, value: 1, size: 4 })),
          h('button', { id: 'act-fork', type: 'button', onclick: () => actFork(n), disabled: n.status === 'draft' || n.status === 'pruned' }, 'Fork…'),
          h('button', { id: 'act-promote', type: 'button', onclick: () => actPromote(n), disabled: canonical || n.status === 'draft' }, 'Promote…'),
          h('button', { id: 'act-prune', type: 'button', class: 'danger', onclick: () => actPrune(n), disabled: n.status === 'pruned' }, 'Prune…'),
          h('button', { id: 'act-diff-parent', type: 'button', disabled: !n.parents.length, onclick: () => openDiff(n.parents[0], n.node_id) }, 'Diff with parent'),
          h('button', { id: 'act-diff-canonical', type: 'button', disabled: canonical || !g, onclick: () => openDiff(g.canonical_node_id, n.node_id) }, 'Diff with canonical'),
        ),
        h('div', { class: 'cmds' }, ...commands(n, g).map((c) => h('code', {}, c, copyButton(c))))),
      sect('Provenance', h('dl', { class: 'kv', id: 'provenance' },
        ...Object.entries(n.provenance || {}).flatMap(([k, val]) => [h('dt', {}, k), h('dd', {}, typeof val === 'object' ? JSON.stringify(val) : String(val))]))),
      sect('Logical state', h('pre', {}, n.logical_state === undefined ? '—' : JSON.stringify(n.logical_state, null, 2))),
      sect('Parents', n.parents.length ? h('ul', {}, n.parents.map(link)) : h('p', {}, 'none: the group root')),
      sect('Children (' + n.children.length + ')', n.children.length ? h('ul', {}, n.children.slice(0, 100).map(link)) : h('p', {}, 'none'),
        n.children.length > 100 ? h('p', {}, '… and ' + (n.children.length - 100) + ' more') : ''),
      sect('Evaluations (' + n.evaluations.length + ')', n.evaluations.length ? h('table', { class: 'grid', id: 'evaluations' },
        h('thead', {}, h('tr', {}, ['evaluator', 'reward', 'verdict', 'terminal', 'backprop', 'evidence', 'id'].map((x) => h('th', {}, x)))),
        h('tbody', {}, n.evaluations.map((ev) => h('tr', {},
          h('td', {}, ev.evaluator + '@' + ev.evaluator_version), h('td', {}, num(ev.reward)), h('td', {}, ev.verdict),
          h('td', {}, ev.terminal ? 'yes' : ''), h('td', {}, ev.backprop ? 'yes' : ''),
          h('td', {}, (ev.evidence || []).map((e) => h('div', {}, idCell(e)))), h('td', {}, idCell(ev.evaluation_id)))))) : h('p', {}, 'none')),
      sect('Leases (' + n.leases.length + ')', n.leases.length ? h('table', { class: 'grid' },
        h('thead', {}, h('tr', {}, ['lease', 'attempt', 'token', 'expires'].map((x) => h('th', {}, x)))),
        h('tbody', {}, n.leases.map((l) => h('tr', {}, h('td', {}, idCell(l.lease_id)), h('td', {}, idCell(l.attempt_id)),
          h('td', {}, l.token), h('td', {}, new Date(l.expires_at).toLocaleTimeString()))))) : h('p', {}, 'none')),
      sect('Attempts (' + n.attempts.length + (n.attempts.length > 10 ? ', newest 10' : '') + ')', attempts.length ? h('table', { class: 'grid' },
        h('thead', {}, h('tr', {}, ['attempt', 'state', 'executor', 'result', 'error'].map((x) => h('th', {}, x)))),
        h('tbody', {}, attempts.map((a) => h('tr', {}, h('td', {}, idCell(a.attempt_id)), h('td', {}, a.state), h('td', {}, a.executor || ''),
          h('td', {}, a.result_node_id ? idCell(a.result_node_id, '#/g/' + n.group_id + '/n/' + a.result_node_id) : ''), h('td', {}, a.error || ''))))) : h('p', {}, 'none')),
    ].flat());
  }

  function commands(n, g) {
    const c = [
      'esfctl inspect ' + n.node_id,
      'esfctl fork ' + n.node_id + ' -n 1',
      'esfctl activate ' + n.node_id,
    ];
    if (g) c.push('esfctl promote ' + g.group_id + ' ' + n.node_id + ' --expected-generation ' + g.generation);
    c.push('esfctl prune ' + n.node_id);
    if (n.parents.length) c.push('esfctl diff ' + n.parents[0] + ' ' + n.node_id);
    c.push('esfctl export ' + n.node_id + ' --to DIR');
    return c;
  }

  function confirmAction(title, body, cmd) {
    return new Promise((resolve) => {
      const d = $('#confirm');
      $('#confirm-title').textContent = title;
      $('#confirm-body').textContent = body;
      $('#confirm-cmd').textContent = cmd;
      d.returnValue = '';
      d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
      d.showModal();
      $('#confirm-ok').focus();
    });
  }

  async function actFork(n) {
    const k = Math.max(1, Math.min(10000, parseInt($('#fork-n').value, 10) || 1));
    if (!await confirmAction('Fork ' + shortID(n.node_id) + '?', 'Create ' + k + ' draft ' + (k === 1 ? 'child' : 'children') + ' of ' + n.node_id + '.',
      'esfctl fork ' + n.node_id + ' -n ' + k)) return;
    try {
      const res = await postJSON('/api/fork', { node_id: n.node_id, n: k });
      toast('forked ' + res.nodes.length + ': ' + res.nodes.map((x) => shortID(x.node_id)).join(' '));
    } catch (e) { toast('fork: ' + e.message); }
  }
  async function actPromote(n) {
    const g = S.tree.group;
    if (!await confirmAction('Promote ' + shortID(n.node_id) + '?',
      'Make ' + n.node_id + ' the canonical node of ' + g.group_id + ': generation ' + g.generation + ' → ' + (g.generation + 1) +
      ' (refused if another promote moved it first).',
      'esfctl promote ' + g.group_id + ' ' + n.node_id + ' --expected-generation ' + g.generation)) return;
    try {
      const res = await postJSON('/api/promote', { group_id: g.group_id, node_id: n.node_id, expected_generation: g.generation });
      toast('promoted: generation ' + res.generation);
    } catch (e) { toast('promote: ' + e.message); }
  }
  async function actPrune(n) {
    if (!await confirmAction('Prune ' + shortID(n.node_id) + '?', 'Mark ' + n.node_id + ' and every node below it pruned.',
      'esfctl prune ' + n.node_id)) return;
    try {
      const res = await postJSON('/api/prune', { node_id: n.node_id });
      toast('pruned ' + res.pruned.length);
    } catch (e) { toast('prune: ' + e.message); }
  }

  // ---- diff --------------------------------------------------------------

  async function openDiff(a, b) {
    S.diffA = a; S.diffB = b;
    draw();
    showTab('diff');
    const pane = $('#pane-diff');
    pane.replaceChildren(h('p', {}, 'diffing…'));
    let d;
    try { d = await getJSON('/api/diff?a=' + encodeURIComponent(a) + '&b=' + encodeURIComponent(b)); } catch (e) {
      pane.replaceChildren(h('p', {}, 'diff: ' + e.message)); return;
    }
    if (S.diffA !== a || S.diffB !== b) return;
    const patch = h('div', { id: 'file-diff' });
    pane.replaceChildren(
      h('h2', {}, 'Diff'),
      h('dl', { class: 'kv' }, h('dt', {}, 'from (A)'), h('dd', {}, idCell(a)), h('dt', {}, 'to (B)'), h('dd', {}, idCell(b))),
      h('div', { class: 'cmds' }, h('code', {}, 'esfctl diff ' + a + ' ' + b, copyButton('esfctl diff ' + a + ' ' + b))),
      h('h3', {}, d.changes.length + ' changed paths'),
      h('table', { class: 'grid', id: 'changes' },
        h('thead', {}, h('tr', {}, h('th', {}, 'kind'), h('th', {}, 'path'), h('th', {}, 'meta'))),
        h('tbody', {}, d.changes.map((c) => h('tr', { 'data-path': c.path },
          h('td', { class: 'kind-' + c.kind }, c.kind),
          h('td', {}, (c.new || c.old || {}).type === 'file' || c.kind === 'modified'
            ? h('a', { href: '#', class: 'path', onclick: (e) => { e.preventDefault(); fileDiff(a, b, c.path, patch); } }, '/' + c.path)
            : '/' + c.path),
          h('td', {}, c.meta || ''))))),
      patch,
    );
  }

  async function fileDiff(a, b, path, into) {
    into.replaceChildren(h('p', {}, 'loading…'));
    let d;
    try { d = await getJSON('/api/filediff?a=' + encodeURIComponent(a) + '&b=' + encodeURIComponent(b) + '&path=' + encodeURIComponent(path)); } catch (e) {
      into.replaceChildren(h('p', {}, 'file diff: ' + e.message)); return;
    }
    const lines = (d.patch || '').split('\n');
    into.replaceChildren(h('h3', {}, '/' + path),
      d.patch ? h('pre', { class: 'patch' }, lines.map((l) => h('span', {
        class: l.startsWith('@@') ? 'hunk' : l.startsWith('+') && !l.startsWith('+++') ? 'add' : l.startsWith('-') && !l.startsWith('---') ? 'del' : '',
      }, l))) : h('p', {}, 'no text difference (binary or metadata only)'),
      d.truncated ? h('p', {}, 'the patch was too large and is cut') : '');
  }

  // ---- files -------------------------------------------------------------

  async function loadFiles() {
    const node = S.selected;
    if (!node) return;
    const m = S.model && S.model.byId.get(node);
    const id = m ? m.n.root_id : node;
    const path = S.files.path || '';
    const pane = $('#pane-files');
    pane.replaceChildren(h('p', {}, 'listing…'));
    let d;
    try { d = await getJSON('/api/ls?id=' + encodeURIComponent(id) + '&path=' + encodeURIComponent(path)); } catch (e) {
      pane.replaceChildren(h('p', {}, 'files: ' + e.message)); return;
    }
    if (S.selected !== node) return;
    const cd = (p) => { S.files.path = p; loadFiles(); };
    const up = path.includes('/') ? path.slice(0, path.lastIndexOf('/')) : '';
    const preview = h('div', { id: 'file-preview' });
    const fileURL = (p, inline) => '/api/file?id=' + encodeURIComponent(id) + '&path=' + encodeURIComponent(p) + (inline ? '&inline=1' : '');
    pane.replaceChildren(
      h('h2', {}, 'Files of ', h('span', { class: 'id' }, shortID(node)), ' /' + path),
      h('p', {}, 'read-only · root ', idCell(id)),
      h('table', { class: 'grid', id: 'files' },
        h('thead', {}, h('tr', {}, h('th', {}, 'name'), h('th', {}, 'type'), h('th', {}, 'size'), h('th', {}, 'mode'), h('th', {}, ''))),
        h('tbody', {},
          path ? h('tr', {}, h('td', {}, h('a', { href: '#', onclick: (e) => { e.preventDefault(); cd(up); } }, '..')), h('td', {}, 'dir'), h('td'), h('td'), h('td')) : '',
          d.entries.map((e) => {
            const p = path ? path + '/' + e.name : e.name;
            return h('tr', { 'data-name': e.name },
              h('td', {}, e.type === 'dir'
                ? h('a', { href: '#', onclick: (ev) => { ev.preventDefault(); cd(p); } }, e.name + '/')
                : e.type === 'file' ? h('a', { href: '#', onclick: (ev) => { ev.preventDefault(); showFile(fileURL(p, true), p, preview); } }, e.name)
                  : e.name + (e.target ? ' → ' + e.target : '')),
              h('td', {}, e.type), h('td', {}, e.type === 'file' ? e.size : ''), h('td', {}, (e.mode & 0o7777).toString(8)),
              h('td', {}, e.type === 'file' ? h('a', { href: fileURL(p, false), download: e.name }, 'download') : ''));
          }))),
      d.truncated ? h('p', {}, 'the tree is large: the listing is cut') : '',
      preview);
  }

  async function showFile(url, path, into) {
    const r = await fetch(url, { credentials: 'same-origin' });
    const text = r.ok ? await r.text() : 'error ' + r.status;
    into.replaceChildren(h('h3', {}, '/' + path), h('pre', {}, text.length > 200000 ? text.slice(0, 200000) + '\n…' : text));
  }

  // ---- live --------------------------------------------------------------

  const timers = {};
  function later(key, fn, ms) {
    if (timers[key]) return;
    timers[key] = setTimeout(() => { timers[key] = 0; fn(); }, ms);
  }

  // Tree reloads follow events no faster than the last reload took (at
  // least 250 ms apart), one at a time: a search that forks and evaluates
  // all the time must not keep a 10,000-node page refetching.
  let treeLoading = false, treeDirty = false;
  function reloadTree(now) {
    if (treeLoading) { treeDirty = true; return; }
    const wait = now ? 0 : Math.max(250, S.lastRender ? S.lastRender.total_ms : 0);
    later('tree', async () => {
      treeLoading = true;
      try { await loadTree(); } finally {
        treeLoading = false;
        if (treeDirty) { treeDirty = false; reloadTree(); }
      }
    }, wait);
  }

  function connect() {
    const es = new EventSource('/api/events');
    const live = $('#live');
    es.addEventListener('hello', () => {
      S.live = true;
      live.textContent = 'live'; live.className = 'live on';
      // Whatever happened while disconnected: reload what is shown.
      if (S.route.view === 'groups') later('groups', loadGroups, 0);
      else if (S.model) {
        reloadTree(true);
        if (S.selected) later('node', () => S.selected && loadNode(S.selected), 0);
      }
    });
    es.onmessage = (m) => {
      let ev;
      try { ev = JSON.parse(m.data); } catch (e) { return; }
      if (S.route.view === 'groups') { later('groups', loadGroups, 250); return; }
      if (ev.group_id && ev.group_id === S.route.group) {
        reloadTree();
        if (S.selected && $('#pane-node').offsetParent !== null) later('node', () => S.selected && loadNode(S.selected), 300);
      }
    };
    es.onerror = () => {
      S.live = false;
      live.textContent = 'reconnecting'; live.className = 'live off';
    };
  }

  // A hook for tests and for people at the console: what the last frame
  // drew (every laid-out node with its status colour and marks) and how
  // long the last tree took to fetch, lay out and draw.
  window.esfUI = {
    drawn: () => S.drawn.map((d) => ({ ...d })),
    lastRender: () => S.lastRender,
    live: () => S.live,
    state: () => ({ route: S.route, selected: S.selected, diffA: S.diffA, diffB: S.diffB, generation: S.tree ? S.tree.group.generation : 0,
      canonical: S.tree ? S.tree.group.canonical_node_id : '', scale: S.view.scale }),
    select: (id) => select(id, { center: true }),
    siblings: (id) => { const m = S.model && S.model.byId.get(id); return m ? (m.parent ? m.parent.kids : S.model.roots).map((k) => k.n.node_id) : []; },
    center,
    fit: () => { fit(); drawNow(); },
    drawNow: () => drawNow(),
  };

  window.addEventListener('hashchange', onRoute);
  connect();
  onRoute();
})();
