/*
 * console.js - Kiln's web console (served at /console/ by `kiln serve`).
 *
 * Reads only this server: /v1/models (the model list), /v1/models/{m}/metadata
 * (signatures), /v2 (server version) and /console/api/stats (versions, load
 * and optimization logs, and the cumulative request and batching histograms,
 * polled every refresh_ms). Rates and windowed percentiles are computed here
 * from the difference of two reads. Charts are small SVGs drawn by hand.
 * "Try a prediction" builds an example request from the signature, can turn
 * a dropped image into an image-shaped float input, POSTs to :predict and
 * shows the reply as the server wrote it (and probability vectors as bars).
 * The rollout and monitoring panel reads /v1/rollouts and
 * /v1/models/{m}/monitoring and has the rollout's admin buttons.
 *
 * No inline script or style (the Content-Security-Policy forbids them): the
 * DOM is built with createElement, sizes set through the CSSOM.
 */
'use strict';

const INFER_APIS = new Set(['predict', 'classify', 'regress']);
const HISTORY = 91;          /* snapshots kept: 3 minutes at 2 s */
const WINDOW = 5;            /* snapshots in a percentile window */
const FLOAT_TYPES = new Set(['DT_FLOAT', 'DT_DOUBLE', 'DT_HALF', 'DT_BFLOAT16']);

const state = {
  models: [],                /* /v1/models */
  stats: null,               /* last /console/api/stats */
  history: new Map(),        /* "model/version" -> [snapshot] */
  selected: null,            /* model name */
  metadata: new Map(),       /* model -> metadata reply (or {error}) */
  refreshMs: 2000,
  tab: 'overview',
  imageSettings: new Map(),  /* input name -> settings */
  predictFor: null,          /* model the form was built for */
  rollouts: null,            /* /v1/rollouts' list (null: no rollout file) */
  rolloutsOff: false,        /* /v1/rollouts answered 404: no rollout file */
  monitoring: new Map(),     /* model -> its /monitoring reply */
  rolloutMessage: null,      /* {model, text}: the last admin button's answer */
  driftOpen: new Set(),      /* "model/version" whose folded drift table is open */
};

/* ------------------------------------------------------------ DOM helpers */

function $(sel, root) { return (root || document).querySelector(sel); }

/* h('div', {class: 'x', text: 'y', 'data-k': 'v'}, child...) */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') el.textContent = v;
    else if (k === 'class') el.className = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'text') el.textContent = v;
    else el.setAttribute(k, String(v));
  }
  for (const c of children) if (c) el.append(c);
  return el;
}

function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); return el; }

/* fetch that never throws: {ok, status, statusText, text, body (parsed JSON or null)} */
async function request(method, url, body) {
  try {
    const init = { method, cache: 'no-store' };
    if (body !== undefined) { init.body = body; init.headers = { 'Content-Type': 'application/json' }; }
    const r = await fetch(url, init);
    const text = await r.text();
    let parsed = null;
    try { parsed = JSON.parse(text); } catch (e) { parsed = null; }
    return { ok: r.ok, status: r.status, statusText: r.statusText, text, body: parsed };
  } catch (e) {
    return { ok: false, status: 0, statusText: 'network error', text: String(e), body: null };
  }
}

function fmt(v, digits) {
  if (v === null || v === undefined || !isFinite(v)) return '–';
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
  return v.toFixed(digits === undefined ? (a >= 100 ? 0 : a >= 10 ? 1 : 2) : digits);
}

function modelPath(m) { return '/v1/models/' + encodeURIComponent(m); }

/* ------------------------------------------------------------ histograms */

/* Prometheus' histogram_quantile over counts[0..n] (last +Inf) with upper bounds[0..n-1]. */
function quantile(q, counts, bounds) {
  const total = counts.reduce((a, b) => a + b, 0);
  if (total <= 0) return null;
  const rank = q * total;
  let cum = 0;
  for (let i = 0; i < counts.length; i++) {
    const prev = cum;
    cum += counts[i];
    if (cum >= rank && counts[i] > 0) {
      if (i >= bounds.length) return bounds[bounds.length - 1];
      const lo = i === 0 ? 0 : bounds[i - 1];
      return lo + (bounds[i] - lo) * ((rank - prev) / counts[i]);
    }
  }
  return bounds[bounds.length - 1];
}

function diff(a, b) { return a.map((v, i) => v - (b ? b[i] : 0)); }

/* One snapshot per served version: inference counters summed over APIs, batching histograms. */
function snapshot(stats, model, version) {
  const snap = { t: stats.time_ms, count: 0, errors: 0, sum: 0, buckets: null, batch: null };
  for (const r of stats.requests.series) {
    if (r.model !== model || r.version !== version || !INFER_APIS.has(r.api)) continue;
    snap.count += r.count; snap.errors += r.errors; snap.sum += r.sum_us;
    snap.buckets = snap.buckets ? snap.buckets.map((v, i) => v + r.buckets[i]) : r.buckets.slice();
  }
  if (!snap.buckets) snap.buckets = new Array(stats.requests.latency_bounds_us.length + 1).fill(0);
  if (stats.batching) {
    for (const b of stats.batching.series)
      if (b.model === model && b.version === version) snap.batch = b;
  }
  return snap;
}

function record(stats) {
  for (const m of stats.models)
    for (const v of m.versions) {
      if (!v.served) continue;
      const key = m.name + '/' + v.version;
      const list = state.history.get(key) || [];
      list.push(snapshot(stats, m.name, v.version));
      while (list.length > HISTORY) list.shift();
      state.history.set(key, list);
    }
}

/* Series for the charts of one version: one point per interval between snapshots. */
function derive(list, stats) {
  const lb = stats.requests.latency_bounds_us;
  const out = { rate: [], errRate: [], p50: [], p99: [], batch: [], q50: [], q99: [] };
  for (let i = 1; i < list.length; i++) {
    const a = list[i - 1], b = list[i];
    const dt = Math.max((b.t - a.t) / 1000, 1e-3);
    out.rate.push((b.count - a.count) / dt);
    out.errRate.push((b.errors - a.errors) / dt);
    const w = list[Math.max(0, i - WINDOW)];
    const lat = diff(b.buckets, w.buckets);
    const p50 = quantile(0.5, lat, lb), p99 = quantile(0.99, lat, lb);
    out.p50.push(p50 === null ? null : p50 / 1000);
    out.p99.push(p99 === null ? null : p99 / 1000);
    if (stats.batching && b.batch) {
      const wb = w.batch;
      const dn = b.batch.batch_size.count - (wb ? wb.batch_size.count : 0);
      const ds = b.batch.batch_size.sum - (wb ? wb.batch_size.sum : 0);
      out.batch.push(dn > 0 ? ds / dn : null);
      const qd = diff(b.batch.queue_us.buckets, wb ? wb.queue_us.buckets : null);
      const qb = stats.batching.queue_bounds_us;
      const q50 = quantile(0.5, qd, qb), q99 = quantile(0.99, qd, qb);
      out.q50.push(q50 === null ? null : q50 / 1000);
      out.q99.push(q99 === null ? null : q99 / 1000);
    } else {
      out.batch.push(null); out.q50.push(null); out.q99.push(null);
    }
  }
  return out;
}

/* ------------------------------------------------------------ charts */

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

/* A line chart: lines = [{name, cls, values}], values aligned to the right edge. */
function lineChart(id, title, unit, lines) {
  const W = 320, H = 120, L = 38, R = 8, T = 8, B = 18;
  let max = 0;
  for (const l of lines) for (const v of l.values) if (v !== null && v > max) max = v;
  max = niceMax(max);
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img',
    'aria-label': title, id });
  for (const f of [0, 0.5, 1]) {
    const y = T + (H - T - B) * (1 - f);
    svg.append(s('line', { x1: L, x2: W - R, y1: y, y2: y, class: 'gridline' }));
    svg.append(s('text', { x: L - 4, y: y + 3, class: 'axis', 'text-anchor': 'end', text: fmt(max * f) }));
  }
  svg.append(s('text', { x: L, y: H - 4, class: 'axis', text: '−3 min' }));
  svg.append(s('text', { x: W - R, y: H - 4, class: 'axis', 'text-anchor': 'end', text: 'now' }));
  const step = (W - L - R) / (HISTORY - 2);
  const last = {};
  for (const l of lines) {
    const n = l.values.length;
    let pts = [];
    const flush = () => {
      if (pts.length === 1) svg.append(s('circle', { cx: pts[0][0], cy: pts[0][1], r: 1.8, class: 'dot ' + l.cls }));
      else if (pts.length > 1) svg.append(s('polyline', { points: pts.map((p) => p.join(',')).join(' '), class: 'line ' + l.cls }));
      pts = [];
    };
    l.values.forEach((v, i) => {
      if (v === null) { flush(); return; }
      const x = W - R - (n - 1 - i) * step;
      const y = T + (H - T - B) * (1 - v / max);
      pts.push([x.toFixed(1), y.toFixed(1)]);
    });
    flush();
    last[l.name] = n ? l.values[n - 1] : null;
  }
  svg.dataset.last = JSON.stringify(last);
  const legend = h('div', { class: 'legend' });
  for (const l of lines) {
    legend.append(h('span', { class: 'key ' + l.cls }),
      h('span', { class: 'legend-name', text: l.name + ' ' }),
      h('b', { class: 'legend-value', 'data-series': l.name, text: fmt(last[l.name]) + (unit ? ' ' + unit : '') }));
  }
  return h('figure', { class: 'chart-box' }, h('figcaption', { text: title }), legend, svg);
}

/* ------------------------------------------------------------ rendering */

function currentModel() {
  return state.stats ? state.stats.models.find((m) => m.name === state.selected) : null;
}

function renderModelList() {
  const ul = clear($('#model-list'));
  $('#no-models').hidden = state.models.length > 0;
  for (const m of state.models) {
    const served = (m.versions || []).filter((v) => v.state === 'AVAILABLE').map((v) => v.version);
    const li = h('li', { 'data-model': m.name, class: m.name === state.selected ? 'selected' : '' },
      h('button', { type: 'button', class: 'model-button', text: m.name }),
      h('span', { class: 'pill ' + (m.ready ? 'ok' : 'bad'), text: m.ready ? 'ready' : 'not ready' }),
      h('span', { class: 'muted versions-list', text: served.length ? 'v' + served.join(', v') : 'no version' }));
    li.querySelector('button').addEventListener('click', () => select(m.name));
    ul.append(li);
  }
}

function parseLoadLog(text) {
  const out = [];
  const re = /(\w+)=("(?:[^"\\]|\\.)*"|\S+)/g;
  let m;
  while ((m = re.exec(text || '')) !== null) if (m[1] !== 'optimization_log') out.push([m[1], m[2]]);
  return out;
}

function renderVersions() {
  const m = currentModel();
  const tbody = clear($('#versions tbody'));
  const logs = clear($('#version-logs'));
  if (!m) return;
  const labelsOf = (v) => Object.entries(m.labels || {}).filter(([, lv]) => lv === v).map(([l]) => l);
  for (const v of m.versions) {
    const snapList = state.history.get(m.name + '/' + v.version) || [];
    const last = snapList[snapList.length - 1];
    const load = parseLoadLog(v.load_log).filter(([k]) => /load_ms|warmup_ms|precompile_ms|format/.test(k));
    const stateCell = h('td', {}, h('span', { class: 'pill ' + (v.state === 'AVAILABLE' ? 'ok' : v.error_code !== 'OK' ? 'bad' : ''), text: v.state }));
    if (v.error_code && v.error_code !== 'OK')
      stateCell.append(h('div', { class: 'error-text', text: v.error_code + ': ' + v.error_message }));
    tbody.append(h('tr', { 'data-version': v.version },
      h('td', { class: 'mono', text: v.version }),
      stateCell,
      h('td', { text: labelsOf(v.version).join(', ') || '–' }),
      h('td', { class: 'mono', text: v.precision || '–' }),
      h('td', { class: 'num requests', text: last ? String(last.count) : '–' }),
      h('td', { class: 'num errors', text: last ? String(last.errors) : '–' }),
      h('td', { class: 'mono small', text: load.map(([k, val]) => k + '=' + val).join(' ') || '–' })));
    if (v.served) {
      logs.append(h('details', { class: 'optlog', 'data-version': v.version },
        h('summary', { text: `Version ${v.version}: load log and optimization log (${v.precision})` }),
        h('pre', { class: 'mono small', text: v.load_log || '' }),
        h('pre', { class: 'mono small', text: v.optimization_log || '(none)' })));
    }
  }
}

function dims(info) {
  const shape = info.tensor_shape || {};
  if (shape.unknown_rank) return null;
  return (shape.dim || []).map((d) => Number(d.size));
}

function shapeText(info) {
  const d = dims(info);
  return d === null ? 'unknown rank' : '[' + d.map((x) => (x < 0 ? '?' : x)).join(', ') + ']';
}

function dtypeText(dt) { return String(dt || '').replace(/^DT_/, '').toLowerCase(); }

function signaturesOf(model) {
  const md = state.metadata.get(model);
  if (!md || !md.body || !md.body.metadata) return null;
  return md.body.metadata.signature_def.signature_def;
}

function renderSignatures() {
  const box = clear($('#signatures'));
  const md = state.metadata.get(state.selected);
  if (!md) { box.append(h('p', { class: 'muted', text: 'Loading…' })); return; }
  if (md.notServed) {
    box.append(h('p', { class: 'muted', text: 'No version of this model is served; its signatures appear here when one is.' }));
    return;
  }
  if (!md.ok) { box.append(h('pre', { class: 'error-text', text: `HTTP ${md.status}\n${md.text}` })); return; }
  const sigs = signaturesOf(state.selected);
  for (const [name, sig] of Object.entries(sigs)) {
    const t = h('table', { class: 'grid sig', 'data-signature': name },
      h('thead', {}, h('tr', {}, h('th', { text: 'Kind' }), h('th', { text: 'Name' }),
        h('th', { text: 'dtype' }), h('th', { text: 'Shape' }))));
    const tb = h('tbody');
    for (const kind of ['inputs', 'outputs'])
      for (const [alias, info] of Object.entries(sig[kind] || {}))
        tb.append(h('tr', { class: kind },
          h('td', { text: kind === 'inputs' ? 'input' : 'output' }),
          h('td', { class: 'mono', text: alias }),
          h('td', { class: 'mono', text: dtypeText(info.dtype) }),
          h('td', { class: 'mono', text: shapeText(info) })));
    t.append(tb);
    box.append(h('h3', {}, h('span', { class: 'mono', text: name }), ' ',
      h('span', { class: 'muted small', text: sig.method_name || '' })), t);
  }
}

/* Rollout and monitoring: the model's rollout from GET /v1/rollouts (state,
 * step, weights, each gate's threshold, what it saw and the verdict, the
 * last events) with the admin buttons (POST /v1/rollouts/M:pause|:resume|
 * :promote|:rollback; the server decides who may), and the monitoring
 * summary from GET /v1/models/M/monitoring (drift per feature, confidence).
 * Both are re-read on every poll; a 404 means the feature is off. */
const ROLLOUT_ACTIONS = ['pause', 'resume', 'promote', 'rollback'];

function kv(rows) {
  const tb = h('tbody');
  for (const [k, v, attrs] of rows)
    tb.append(h('tr', attrs || {}, h('th', { text: k }), h('td', { class: 'mono small', text: v })));
  return h('table', { class: 'grid kv' }, tb);
}

function gateRows(g) {
  const rows = [];
  const bounds = (b, d) => (b ? `[${fmt(b[0], d)}, ${fmt(b[1], d)}]` : '–');
  if (g.error_rate) rows.push(['error rate', `increase ≤ ${g.error_rate.max_increase}`,
    `increase in ${bounds(g.error_rate.bounds, 4)}`]);
  if (g.p99_latency) rows.push(['p99 latency', `ratio ≤ ${g.p99_latency.max_ratio} (slack ${g.p99_latency.slack_us} µs)`, '']);
  if (g.agreement) rows.push(['agreement', `≥ ${g.agreement.min}`,
    `${g.agreement.agree}/${g.agreement.paired} top-1 equal, in ${bounds(g.agreement.bounds, 4)}`]);
  if (g.output_divergence) rows.push(['output divergence', `mean JS ≤ ${g.output_divergence.max} nats`,
    `${fmt(g.output_divergence.mean, 4)} over ${g.output_divergence.rows} rows, in ${bounds(g.output_divergence.bounds, 4)}`]);
  if (g.input_drift) rows.push(['input drift', 'no feature past the profile', 'see Monitoring below']);
  return rows;
}

function renderRolloutState(box, ro) {
  const stateCls = ro.state === 'rolled_back' ? 'bad' : ro.state === 'promoted' ? 'ok' : '';
  box.append(h('h3', {}, 'Rollout ', h('span', { class: 'pill ' + stateCls, id: 'rollout-state', text: ro.state }),
    ' ', h('span', { class: 'muted small', text: ro.kind + (ro.controlled ? ', controlled by kiln rollout-controller' : '') })));
  const rows = [];
  if (ro.kind === 'canary') {
    rows.push(['candidate', `${ro.candidate} (version ${ro.candidate_version})`]);
    rows.push(['baseline', `version ${ro.baseline_version}`]);
    rows.push(['step', `${ro.step + 1} of ${ro.steps.length} (${ro.step_percent}%): steps ${ro.steps.join(', ')}`,
      { 'data-field': 'step' }]);
    rows.push(['status', ro.status, { 'data-field': 'status' }]);
    if (ro.reason) rows.push(['reason', ro.reason, { 'data-field': 'reason' }]);
    const w = ro.window;
    rows.push(['window', `${fmt(w.seconds, 0)} s: ${w.candidate_requests} candidate, ${w.baseline_requests} baseline requests; ` +
      `error rate ${fmt(w.candidate_error_rate, 4)} vs ${fmt(w.baseline_error_rate, 4)}; p99 ${fmt(w.candidate_p99_us, 0)} vs ${fmt(w.baseline_p99_us, 0)} µs`]);
  }
  rows.push(['weights', ro.weights.map((x) => `v${x.version}: ${fmt(100 * x.weight, 1)}%`).join(', '), { 'data-field': 'weights' }]);
  if (ro.sticky) rows.push(['sticky', 'yes (route key header hashed)']);
  box.append(kv(rows));
  if (ro.gates) {
    const g = ro.gates;
    const verdictCls = g.verdict === 'fail' ? 'bad' : g.verdict === 'pass' ? 'ok' : '';
    const t = h('table', { class: 'grid', 'data-section': 'gates' },
      h('thead', {}, h('tr', {}, h('th', { text: 'Gate' }), h('th', { text: 'Threshold' }), h('th', { text: 'Last window' }))));
    const tb = h('tbody');
    for (const [name, thr, seen] of gateRows(g))
      tb.append(h('tr', { 'data-gate': name }, h('td', { text: name }), h('td', { class: 'mono small', text: thr }),
        h('td', { class: 'mono small', text: seen })));
    t.append(tb);
    box.append(h('h3', {}, 'Gates ', h('span', { class: 'pill ' + verdictCls, id: 'gates-verdict', text: g.evaluated ? g.verdict : 'not evaluated' }),
      ' ', h('span', { class: 'muted small', text: `confidence ${g.confidence}` })), t);
    if (g.reason) box.append(h('p', { class: 'mono small', id: 'gates-reason', text: g.reason }));
  }
  if (ro.kind === 'canary') {
    const bar = h('div', { class: 'actions', id: 'rollout-actions' });
    for (const a of ROLLOUT_ACTIONS) {
      const b = h('button', { type: 'button', 'data-action': a, text: a });
      b.addEventListener('click', () => rolloutAction(ro.model, a));
      bar.append(b);
    }
    const msg = state.rolloutMessage && state.rolloutMessage.model === ro.model ? state.rolloutMessage.text : '';
    bar.append(h('span', { class: 'muted small', id: 'rollout-message', text: msg }));
    box.append(bar);
  }
  if (ro.events && ro.events.length) {
    const t = h('table', { class: 'grid', 'data-section': 'events' },
      h('thead', {}, h('tr', {}, h('th', { text: 'Time (UTC)' }), h('th', { text: 'Event' }), h('th', { text: 'Step' }), h('th', { text: 'Reason' }))));
    const tb = h('tbody');
    for (const e of ro.events.slice().reverse())
      tb.append(h('tr', { 'data-event': e.event }, h('td', { class: 'mono small', text: e.time }), h('td', { text: e.event }),
        h('td', { class: 'num', text: `${e.step_percent}%` }), h('td', { class: 'small', text: e.reason })));
    t.append(tb);
    box.append(h('h3', { text: 'Last events' }), t);
  }
}

async function rolloutAction(model, action) {
  const r = await request('POST', `/v1/rollouts/${encodeURIComponent(model)}:${action}`);
  const why = r.body && (r.body.error || r.body.reason || r.body.state);
  state.rolloutMessage = { model, text: `${action}: HTTP ${r.status}${why ? ' — ' + why : ''}` };
  await pollRollout();
  renderRollout();
}

function renderMonitoring(box, mon) {
  const versions = (mon && mon.versions) || [];
  if (!versions.length) {
    box.append(h('p', { class: 'muted', text: 'No version of this model has a reference profile (assets.extra/kiln_profile.json, written by kiln profile): no drift to show.' }));
    return;
  }
  for (const v of versions) {
    box.append(h('h3', {}, `Monitoring, version ${v.version} `, h('span', { class: 'muted small',
      text: `window ${v.window_seconds} s, judged from ${v.min_count} values; thresholds PSI ${v.thresholds.psi}, JS ${v.thresholds.js}, L-inf ${v.thresholds.linf}` })));
    const t = h('table', { class: 'grid', 'data-section': 'drift', 'data-version': v.version },
      h('thead', {}, h('tr', {}, h('th', { text: 'Feature' }), h('th', { text: 'Kind' }), h('th', { text: 'Values' }),
        h('th', { text: 'PSI' }), h('th', { text: 'JS' }), h('th', { text: 'L-inf' }), h('th', { text: 'Drift' }))));
    const tb = h('tbody');
    for (const f of v.features) {
      const judged = 'alert' in f;
      tb.append(h('tr', { 'data-feature': f.name }, h('td', { class: 'mono', text: f.name }), h('td', { text: f.kind }),
        h('td', { class: 'num', text: f.window_count }), h('td', { class: 'num', text: fmt(f.psi, 3) }),
        h('td', { class: 'num', text: fmt(f.js, 3) }), h('td', { class: 'num', text: fmt(f.linf, 3) }),
        h('td', {}, h('span', { class: 'pill ' + (judged ? (f.alert ? 'bad' : 'ok') : ''),
          text: judged ? (f.alert ? 'drift' : 'ok') : 'too few values' }))));
    }
    t.append(tb);
    /* many features (an image's pixels): folded, with a count of drifting ones */
    if (v.features.length > 12) {
      const drifting = v.features.filter((f) => f.alert).length;
      const d = h('details', { class: 'drift-features', 'data-version': v.version },
        h('summary', { text: `${v.features.length} features, ${drifting} drifting` }), t);
      const key = state.selected + '/' + v.version;
      d.open = drifting > 0 || state.driftOpen.has(key); /* kept across the poll's redraws */
      d.addEventListener('toggle', () => { if (d.open) state.driftOpen.add(key); else state.driftOpen.delete(key); });
      box.append(d);
    } else {
      box.append(t);
    }
    const c = v.confidence;
    if (c) box.append(kv([
      ['confidence output', c.output],
      ['rows in window', String(c.count)],
      ['expected accuracy', fmt(c.expected_accuracy, 3), { 'data-field': 'expected_accuracy' }],
      ['reference mean max probability', fmt(c.reference_mean_max_probability, 3)],
    ]));
  }
}

function renderRollout() {
  const box = clear($('#rollout'));
  const m = currentModel();
  if (!m) return;
  const ro = state.rollouts && state.rollouts.find((x) => x.model === m.name);
  if (ro) renderRolloutState(box, ro);
  else box.append(h('p', { class: 'muted', id: 'rollout-none', text: 'No rollout is configured for this model: ' +
      'requests go to the highest served version (or the version a label names). ' +
      'Start kiln serve with --rollout_config_file for traffic splits and canaries.' }));
  const mon = state.monitoring.get(m.name);
  if (mon && mon.ok) renderMonitoring(box, mon.body);
  else if (mon && mon.status === 404) box.append(h('p', { class: 'muted', text: 'Model monitoring is off.' }));
}

/* GET /v1/rollouts and the selected model's monitoring into state. */
async function pollRollout() {
  /* a server without a rollout file answers an empty list (older servers: 404,
   * after which it is not asked again) */
  const [ro, mon] = await Promise.all([
    state.rolloutsOff ? Promise.resolve(null) : request('GET', '/v1/rollouts'),
    state.selected ? request('GET', modelPath(state.selected) + '/monitoring') : Promise.resolve(null)]);
  if (ro && ro.status === 404) state.rolloutsOff = true;
  state.rollouts = ro && ro.ok && ro.body ? ro.body.rollouts || [] : null;
  if (mon && state.selected) state.monitoring.set(state.selected, mon);
}

function renderLive() {
  const box = clear($('#live'));
  const m = currentModel();
  const stats = state.stats;
  if (!m || !stats) return;
  $('#refresh-s').textContent = String(state.refreshMs / 1000);
  $('#window-s').textContent = String(WINDOW * state.refreshMs / 1000);
  const served = m.versions.filter((v) => v.served);
  if (!served.length) box.append(h('p', { class: 'muted', text: 'No version is served.' }));
  for (const v of served) {
    const list = state.history.get(m.name + '/' + v.version) || [];
    const d = derive(list, stats);
    const last = list[list.length - 1];
    const id = (k) => `chart-${v.version}-${k}`;
    const group = h('section', { class: 'card live-version', 'data-version': v.version },
      h('h2', {}, `Version ${v.version} `, h('span', { class: 'muted small', text:
        last ? `${last.count} requests, ${last.errors} errors since start` : '' })));
    const charts = h('div', { class: 'charts' });
    charts.append(lineChart(id('rate'), 'Request rate', '/s', [
      { name: 'requests', cls: 's1', values: d.rate }, { name: 'errors', cls: 's3', values: d.errRate }]));
    charts.append(lineChart(id('latency'), 'Latency', 'ms', [
      { name: 'p50', cls: 's1', values: d.p50 }, { name: 'p99', cls: 's2', values: d.p99 }]));
    if (stats.batching) {
      charts.append(lineChart(id('batch'), 'Batch size (mean rows per run)', '', [
        { name: 'rows', cls: 's1', values: d.batch }]));
      charts.append(lineChart(id('queue'), 'Queue time', 'ms', [
        { name: 'p50', cls: 's1', values: d.q50 }, { name: 'p99', cls: 's2', values: d.q99 }]));
    } else {
      charts.append(h('figure', { class: 'chart-box off' }, h('figcaption', { text: 'Batch size and queue time' }),
        h('p', { class: 'muted', text: 'Dynamic batching is off: start kiln serve with --enable_batching to see batch sizes and queue time here.' })));
    }
    group.append(charts);
    box.append(group);
  }
}

function renderHeader() {
  const st = state.stats;
  const health = $('#health');
  const ready = state.models.length > 0 && state.models.every((m) => m.ready);
  health.textContent = st ? (ready ? 'ready' : 'not ready') : 'unreachable';
  health.className = 'pill ' + (st && ready ? 'ok' : 'bad');
  const link = $('#link-metrics');
  if (st && st.metrics_path) { link.hidden = false; link.setAttribute('href', st.metrics_path); }
  else link.hidden = true;
  $('#model-title').textContent = state.selected || 'No model';
}

function renderAll() {
  renderHeader();
  renderModelList();
  renderVersions();
  renderRollout();
  if (state.tab === 'live') renderLive();
}

/* ------------------------------------------------------------ prediction */

function zeroOf(dtype) {
  if (dtype === 'DT_STRING') return '';
  if (dtype === 'DT_BOOL') return false;
  return 0;
}

function nested(shape, leaf) {
  if (!shape.length) return leaf();
  const n = shape[0] < 0 ? 1 : shape[0];
  const out = [];
  for (let i = 0; i < n; i++) out.push(nested(shape.slice(1), leaf));
  return out;
}

/* A valid example: one instance of every input in the row format when every
 * input has a symbolic batch dimension (dimension 0), else the columnar
 * format with whole tensors (symbolic dimensions as 1). */
function exampleRequest(sigName, sig) {
  const inputs = Object.entries(sig.inputs || {});
  const batched = inputs.every(([, info]) => { const d = dims(info); return d === null || (d.length > 0 && d[0] < 0); });
  const req = {};
  if (sigName !== 'serving_default') req.signature_name = sigName;
  const vals = {};
  for (const [alias, info] of inputs) {
    const d = dims(info) || [-1];
    vals[alias] = nested(batched ? d.slice(1) : d, () => zeroOf(info.dtype));
  }
  if (batched) req.instances = [inputs.length === 1 ? vals[inputs[0][0]] : vals];
  else req.inputs = vals;
  return req;
}

/* Image geometry of an input, or null: float inputs of rank 4 (NHWC or NCHW),
 * rank 3 [N, H, W], or rank 2 with a square count of values (the digits
 * model's 64 = 8 x 8). */
function imageLayout(info) {
  if (!FLOAT_TYPES.has(info.dtype)) return null;
  const d = dims(info);
  if (!d) return null;
  const size = (x) => (x > 0 ? x : 224);
  if (d.length === 4) {
    if (d[3] === 1 || d[3] === 3) return { layout: 'NHWC', h: size(d[1]), w: size(d[2]), c: d[3] };
    if (d[1] === 1 || d[1] === 3) return { layout: 'NCHW', h: size(d[2]), w: size(d[3]), c: d[1] };
    return null;
  }
  if (d.length === 3 && d[1] > 0 && d[2] > 0) return { layout: 'HW', h: d[1], w: d[2], c: 1 };
  if (d.length === 2 && d[1] >= 16) {
    const side = Math.round(Math.sqrt(d[1]));
    if (side * side === d[1]) return { layout: 'flat', h: side, w: side, c: 1 };
  }
  return null;
}

function defaultImageSettings(geo) {
  /* the digits model takes 0..16 with the ink high; others 0..1 */
  const digits = geo.layout === 'flat' && geo.h === 8;
  return { min: 0, max: digits ? 16 : 1, invert: digits, mean: '0', std: '1' };
}

function currentRequestObject() {
  try { return JSON.parse($('#predict-body').value); } catch (e) { return null; }
}

/* One top-level key per line, each value compact (an image is thousands of numbers). */
function setRequestObject(obj) {
  $('#predict-body').value = '{\n' + Object.entries(obj).map(([k, v]) => `  ${JSON.stringify(k)}: ${JSON.stringify(v)}`)
    .join(',\n') + '\n}';
}

/* Pixels -> the input's nested array, with the page's settings. */
function imageToValue(pixels, geo, st) {
  const perChannel = (txt) => String(txt).split(',').map(Number);
  const mean = perChannel(st.mean), std = perChannel(st.std);
  const chan = (c, arr) => (arr.length > c ? arr[c] : arr[0]);
  const val = (y, x, c) => {
    const i = (y * geo.w + x) * 4;
    let p;
    if (geo.c === 1) p = 0.299 * pixels[i] + 0.587 * pixels[i + 1] + 0.114 * pixels[i + 2];
    else p = pixels[i + c];
    if (st.invert) p = 255 - p;
    const v = Number(st.min) + (Number(st.max) - Number(st.min)) * p / 255;
    return Math.round(((v - chan(c, mean)) / (chan(c, std) || 1)) * 1e5) / 1e5;
  };
  const rows = (fn) => Array.from({ length: geo.h }, (_, y) => Array.from({ length: geo.w }, (_, x) => fn(y, x)));
  switch (geo.layout) {
    case 'flat': return rows((y, x) => val(y, x, 0)).flat();
    case 'HW': return rows((y, x) => val(y, x, 0));
    case 'NHWC': return rows((y, x) => Array.from({ length: geo.c }, (_, c) => val(y, x, c)));
    default: return Array.from({ length: geo.c }, (_, c) => rows((y, x) => val(y, x, c)));
  }
}

async function applyImage(alias, geo, file) {
  const st = state.imageSettings.get(alias);
  if (file) st.file = file;
  if (!st.file) return;
  let bmp;
  try { bmp = await createImageBitmap(st.file); } catch (e) {
    $('#predict-status').textContent = `${st.file.name}: not an image this browser can decode`;
    return;
  }
  const canvas = $(`canvas[data-input="${CSS.escape(alias)}"]`);
  canvas.width = geo.w; canvas.height = geo.h;
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, geo.w, geo.h);
  ctx.imageSmoothingEnabled = true;
  ctx.imageSmoothingQuality = 'high';
  ctx.drawImage(bmp, 0, 0, geo.w, geo.h);
  canvas.hidden = false;
  const px = ctx.getImageData(0, 0, geo.w, geo.h).data;
  const value = imageToValue(px, geo, st);
  const sigName = $('#predict-signature').value;
  const sig = signaturesOf(state.selected)[sigName];
  let req = currentRequestObject();
  const ok = req && ((Array.isArray(req.instances) && req.instances.length) || (req.inputs && typeof req.inputs === 'object'));
  if (!ok) req = exampleRequest(sigName, sig);
  const multi = Object.keys(sig.inputs).length > 1;
  if (req.instances) { if (multi) req.instances[0][alias] = value; else req.instances[0] = value; }
  else req.inputs[alias] = [value]; /* columnar: a batch of one image */
  setRequestObject(req);
  $('#predict-status').textContent = `${st.file.name} → ${geo.w}×${geo.h}${geo.c === 3 ? ' RGB' : ' grayscale'}, ` +
    `values ${st.min}..${st.max}${st.invert ? ' inverted' : ''}`;
}

function imageControls(alias, geo) {
  if (!state.imageSettings.has(alias)) state.imageSettings.set(alias, defaultImageSettings(geo));
  const st = state.imageSettings.get(alias);
  const file = h('input', { type: 'file', accept: 'image/*', 'data-input': alias, class: 'file' });
  const drop = h('div', { class: 'drop', 'data-input': alias },
    h('span', { text: 'Drop an image here, or ' }), file);
  const canvas = h('canvas', { class: 'preview', 'data-input': alias, width: geo.w, height: geo.h, hidden: true });
  const num = (key, label, step) => {
    const el = h('input', { type: 'text', value: st[key], size: 5, 'data-setting': key, inputmode: step ? 'decimal' : undefined });
    el.addEventListener('change', () => { st[key] = el.value; applyImage(alias, geo); });
    return h('label', {}, label + ' ', el);
  };
  const inv = h('input', { type: 'checkbox', 'data-setting': 'invert', checked: st.invert });
  inv.addEventListener('change', () => { st.invert = inv.checked; applyImage(alias, geo); });
  const settings = h('div', { class: 'settings' },
    h('span', { class: 'muted', text: `resized to ${geo.w}×${geo.h}, ${geo.c === 3 ? 'RGB' : 'grayscale'}, layout ${geo.layout}; value = min + (max − min) · pixel/255, then (value − mean) / std` }),
    num('min', 'min', true), num('max', 'max', true), num('mean', 'mean'), num('std', 'std'),
    h('label', {}, inv, ' invert (dark ink → high values)'));
  file.addEventListener('change', () => { if (file.files[0]) applyImage(alias, geo, file.files[0]); });
  drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (e) => {
    e.preventDefault(); drop.classList.remove('over');
    if (e.dataTransfer.files[0]) applyImage(alias, geo, e.dataTransfer.files[0]);
  });
  return h('div', { class: 'image-input' }, drop, canvas, settings);
}

function buildPredictForm(force) {
  const sigs = signaturesOf(state.selected);
  const sel = $('#predict-signature');
  const vsel = $('#predict-version');
  const m = currentModel();
  $('#predict-send').disabled = !sigs;
  if (!sigs) {
    state.predictFor = null;
    clear(sel); clear(vsel); $('#predict-body').value = ''; $('#predict-url').textContent = '';
    clear($('#predict-inputs')).append(h('p', { class: 'muted', text: 'No version of this model is served.' }));
    return;
  }
  if (state.predictFor !== state.selected || force) {
    state.predictFor = state.selected;
    state.imageSettings.clear();
    clear(sel);
    const names = Object.keys(sigs).filter((n) => (sigs[n].method_name || '').endsWith('/predict'));
    for (const n of names) sel.append(h('option', { value: n, text: n, selected: n === 'serving_default' }));
    clear(vsel);
    vsel.append(h('option', { value: '', text: 'latest' }));
    if (m) {
      for (const v of m.versions.filter((x) => x.served)) vsel.append(h('option', { value: 'versions/' + v.version, text: 'version ' + v.version }));
      for (const l of Object.keys(m.labels || {})) vsel.append(h('option', { value: 'labels/' + l, text: 'label ' + l }));
    }
    buildInputs();
  }
}

function predictUrl() {
  const v = $('#predict-version').value;
  return modelPath(state.selected) + (v ? '/' + v : '') + ':predict';
}

function buildInputs() {
  const sigs = signaturesOf(state.selected);
  const name = $('#predict-signature').value;
  const box = clear($('#predict-inputs'));
  if (!sigs || !sigs[name]) return;
  const sig = sigs[name];
  for (const [alias, info] of Object.entries(sig.inputs || {})) {
    const geo = imageLayout(info);
    box.append(h('div', { class: 'input-row', 'data-input': alias },
      h('span', { class: 'mono', text: alias }), ' ',
      h('span', { class: 'muted mono', text: `${dtypeText(info.dtype)} ${shapeText(info)}` }),
      geo ? imageControls(alias, geo) : null));
  }
  setRequestObject(exampleRequest(name, sig));
  $('#predict-url').textContent = 'POST ' + predictUrl();
}

/* Probability vectors in a predict reply: [{label, values}] */
function probabilityVectors(body) {
  const out = [];
  const isProb = (v) => Array.isArray(v) && v.length >= 2 && v.every((x) => typeof x === 'number' && x >= 0 && x <= 1) &&
    Math.abs(v.reduce((a, b) => a + b, 0) - 1) < 1e-2;
  const rows = body && (body.predictions || (body.outputs && (Array.isArray(body.outputs) ? body.outputs : null)));
  if (Array.isArray(rows)) {
    rows.slice(0, 4).forEach((r, i) => {
      if (isProb(r)) out.push({ label: `instance ${i}`, values: r });
      else if (r && typeof r === 'object' && !Array.isArray(r))
        for (const [k, v] of Object.entries(r)) if (isProb(v)) out.push({ label: `instance ${i}: ${k}`, values: v });
    });
  } else if (body && body.outputs && typeof body.outputs === 'object') {
    for (const [k, v] of Object.entries(body.outputs))
      if (Array.isArray(v)) v.slice(0, 4).forEach((r, i) => { if (isProb(r)) out.push({ label: `${k} [${i}]`, values: r }); });
  }
  return out;
}

function renderBars(body) {
  const box = clear($('#predict-bars'));
  for (const pv of probabilityVectors(body)) {
    const ranked = pv.values.map((p, i) => [i, p]).sort((a, b) => b[1] - a[1]).slice(0, 10);
    const list = h('ol', { class: 'bars', 'data-label': pv.label });
    for (const [i, p] of ranked) {
      const fill = h('span', { class: 'bar-fill' });
      fill.style.width = (p * 100).toFixed(1) + '%';
      list.append(h('li', { 'data-class': i }, h('span', { class: 'bar-label mono', text: String(i) }),
        h('span', { class: 'bar' }, fill), h('span', { class: 'bar-value mono', text: (p * 100).toFixed(1) + '%' })));
    }
    box.append(h('h3', { class: 'small', text: pv.label + ': classes by probability' }), list);
  }
}

async function sendPredict() {
  const url = predictUrl();
  const body = $('#predict-body').value;
  $('#predict-status').textContent = 'sending…';
  const t0 = performance.now();
  const r = await request('POST', url, body);
  const ms = performance.now() - t0;
  $('#predict-result').hidden = false;
  const out = $('#predict-response');
  out.className = 'response' + (r.ok ? '' : ' error-text');
  out.dataset.status = String(r.status);
  /* the reply exactly as the server wrote it (numbers keep the server's digits) */
  out.textContent = r.text;
  $('#predict-status').textContent = `HTTP ${r.status} ${r.statusText} in ${ms.toFixed(1)} ms`;
  if (r.ok) renderBars(r.body); else clear($('#predict-bars'));
}

/* ------------------------------------------------------------ control */

/* The served versions of a model, as a key: its metadata is read again when they change. */
function servedKey(m) {
  return m.ready ? (m.versions || []).filter((v) => v.state === 'AVAILABLE').map((v) => v.version).sort().join(',') : '';
}

/* Read the model's metadata when it has a served version and it is not read
 * yet for the versions served now (never for a model with none: no 404s). */
async function ensureMetadata(name) {
  const m = state.models.find((x) => x.name === name);
  if (!m) return;
  const key = servedKey(m);
  const cur = state.metadata.get(name);
  if (cur && cur.key === key) return;
  let r;
  if (!key) {
    r = { key, ok: false, notServed: true };
  } else {
    if (state.reading === name + '/' + key) return;
    state.reading = name + '/' + key;
    r = await request('GET', modelPath(name) + '/metadata');
    r.key = key;
    state.reading = null;
  }
  state.metadata.set(name, r);
  if (name === state.selected) {
    renderSignatures();
    buildPredictForm(cur !== undefined);
  }
}

function select(name) {
  state.selected = name;
  if (location.hash !== '#' + encodeURIComponent(name)) history.replaceState(null, '', '#' + encodeURIComponent(name));
  renderAll();
  renderSignatures();
  if (state.metadata.has(name)) buildPredictForm();
  ensureMetadata(name);
}

function showTab(tab) {
  state.tab = tab;
  for (const b of document.querySelectorAll('.tab')) b.setAttribute('aria-selected', String(b.dataset.tab === tab));
  for (const p of document.querySelectorAll('.tab-panel')) p.hidden = p.id !== 'tab-' + tab;
  if (tab === 'live') renderLive();
}

async function poll() {
  const [list, stats] = await Promise.all([request('GET', '/v1/models'), request('GET', '/console/api/stats')]);
  const banner = $('#banner');
  if (list.ok && list.body && stats.ok && stats.body) {
    banner.hidden = true;
    state.models = list.body.models || [];
    state.stats = stats.body;
    state.refreshMs = stats.body.refresh_ms || 2000;
    record(stats.body);
    if (!state.selected || !state.models.some((m) => m.name === state.selected)) {
      const want = decodeURIComponent(location.hash.slice(1));
      const pick = state.models.find((m) => m.name === want) || state.models[0];
      if (pick) select(pick.name);
    } else {
      ensureMetadata(state.selected);
    }
    await pollRollout();
  } else {
    state.stats = null;
    banner.hidden = false;
    banner.textContent = `Cannot read the server (${list.ok ? '/console/api/stats' : '/v1/models'}: ${list.ok ? stats.status : list.status} ${list.ok ? stats.statusText : list.statusText}); retrying.`;
  }
  renderAll();
  setTimeout(poll, state.refreshMs);
}

async function init() {
  for (const b of document.querySelectorAll('.tab')) b.addEventListener('click', () => showTab(b.dataset.tab));
  $('#predict-send').addEventListener('click', sendPredict);
  $('#predict-reset').addEventListener('click', () => buildInputs());
  $('#predict-signature').addEventListener('change', () => { state.imageSettings.clear(); buildInputs(); });
  $('#predict-version').addEventListener('change', () => { $('#predict-url').textContent = 'POST ' + predictUrl(); });
  window.addEventListener('hashchange', () => {
    const want = decodeURIComponent(location.hash.slice(1));
    if (want !== state.selected && state.models.some((m) => m.name === want)) select(want);
  });
  const v2 = await request('GET', '/v2');
  if (v2.ok && v2.body) $('#server-version').textContent = `${v2.body.name} ${v2.body.version}`;
  poll();
}

document.addEventListener('DOMContentLoaded', init);
