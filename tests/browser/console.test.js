#!/usr/bin/env node
/*
 * console.test.js - Kiln's web console in a real browser: headless Chromium
 * (Debian's /usr/bin/chromium) driven by puppeteer-core, against `kiln serve`
 * on a loopback port serving the bundled digits model (models/digits/) with a
 * version label, dynamic batching, CORS and the Prometheus page on.
 *
 * Checks: the console's replies carry the Content-Security-Policy; the page
 * loads with no console error and no request to another host; the model
 * list matches /v1/models and the signature table the metadata; the
 * prediction form's example is valid, and a prediction from the form equals
 * the same request sent directly (and the true label of a held-out digit);
 * an 8x8 PNG dropped into the form becomes the input's 64 values; the live
 * charts move under load (request counts, rate, batch sizes); a server
 * error is shown exactly as the server wrote it; and a second server
 * started with --enable_console=false answers 404 under /console/. The
 * rollout and monitoring panel matches /v1/rollouts (a split, then a
 * canary on a second server) and the monitoring view, and its buttons
 * pause and promote the canary.
 *
 * Run by tests/browser/run.sh (ctest: browser_console). Environment:
 * KILN_BIN (default build/kiln), CHROMIUM (default /usr/bin/chromium),
 * KILN_SCREENSHOTS=DIR to also write the docs' screenshots there.
 * Exits 0 on success, 1 with a message on the first failure.
 */
'use strict';

const { spawn, spawnSync } = require('child_process');
const fs = require('fs');
const net = require('net');
const os = require('os');
const path = require('path');
const zlib = require('zlib');
const assert = require('assert/strict');
const puppeteer = require('puppeteer-core');

const REPO = path.resolve(__dirname, '..', '..');
const KILN = process.env.KILN_BIN || path.join(REPO, 'build', 'kiln');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SHOTS = process.env.KILN_SCREENSHOTS || '';
const t0 = Date.now();

function log(msg) { console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}`); }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* ------------------------------------------------------------ fixtures */

/* A .npy file (float32 or int64, C order) -> {shape, data} */
function readNpy(file) {
  const buf = fs.readFileSync(file);
  assert.equal(buf.toString('latin1', 1, 6), 'NUMPY', `${file}: not a .npy file`);
  const major = buf[6];
  const hlen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12) + hlen;
  const header = buf.toString('latin1', major === 1 ? 10 : 12, start);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').filter((x) => x.trim()).map(Number);
  const n = shape.reduce((a, b) => a * b, 1);
  const data = [];
  for (let i = 0; i < n; i++) {
    if (descr === '<f4') data.push(buf.readFloatLE(start + 4 * i));
    else if (descr === '<i8') data.push(Number(buf.readBigInt64LE(start + 8 * i)));
    else throw new Error(`${file}: dtype ${descr} not handled`);
  }
  return { shape, data };
}

function crc32(buf) {
  let c = ~0;
  for (const b of buf) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return ~c >>> 0;
}

/* An 8-bit grayscale PNG of w x h pixels. */
function grayPng(w, h, pixels) {
  const chunk = (type, data) => {
    const len = Buffer.alloc(4); len.writeUInt32BE(data.length);
    const td = Buffer.concat([Buffer.from(type, 'latin1'), data]);
    const crc = Buffer.alloc(4); crc.writeUInt32BE(crc32(td));
    return Buffer.concat([len, td, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0); ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8; ihdr[9] = 0; ihdr[10] = 0; ihdr[11] = 0; ihdr[12] = 0;
  const raw = Buffer.alloc(h * (w + 1));
  for (let y = 0; y < h; y++) {
    raw[y * (w + 1)] = 0;
    for (let x = 0; x < w; x++) raw[y * (w + 1) + 1 + x] = pixels[y * w + x];
  }
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr), chunk('IDAT', zlib.deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => { const p = srv.address().port; srv.close(() => resolve(p)); });
  });
}

async function startServer(args, tmp) {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const proc = spawn(KILN, ['serve', `--rest_api_port=${port}`, '--rest_api_address=127.0.0.1',
    '--rest_api_num_threads=8', '--file_system_poll_wait_seconds=0', ...args],
  { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  for (let i = 0; i < 300; i++) {
    if (proc.exitCode !== null) throw new Error(`kiln serve exited early:\n${stderr}`);
    try { if ((await fetch(base + '/v2/health/ready')).ok) break; } catch (e) { /* not yet */ }
    await sleep(100);
  }
  return {
    base, proc, log: () => stderr,
    async stop() {
      proc.kill('SIGTERM');
      const r = await exited;
      assert.equal(r.code, 0, `kiln serve exited with ${r.code} (${r.sig}) after SIGTERM:\n${stderr.slice(-3000)}`);
    },
  };
}

async function post(base, p, body) {
  const r = await fetch(base + p, { method: 'POST', body, headers: { 'Content-Type': 'application/json' } });
  return { status: r.status, text: await r.text() };
}

function closeArrays(a, b, tol, where) {
  if (typeof a === 'number') {
    assert.ok(typeof b === 'number' && Math.abs(a - b) <= tol * Math.max(1, Math.abs(b)),
      `${where}: ${a} vs ${b}`);
    return;
  }
  if (Array.isArray(a)) {
    assert.ok(Array.isArray(b) && a.length === b.length, `${where}: lengths differ`);
    a.forEach((x, i) => closeArrays(x, b[i], tol, `${where}[${i}]`));
    return;
  }
  assert.equal(typeof a, 'object', where);
  assert.deepEqual(Object.keys(a).sort(), Object.keys(b).sort(), `${where}: keys`);
  for (const k of Object.keys(a)) closeArrays(a[k], b[k], tol, `${where}.${k}`);
}

/* ------------------------------------------------------------ rollout panel */

/*
 * A canary of the digits model (version 2 is the same file as version 1)
 * with a reference profile on version 2 (kiln profile over the sample
 * digits): the panel's state, step, weights, gates and drift table match
 * /v1/rollouts and /v1/models/digits/monitoring, and its buttons change the
 * server's state (pause, then promote).
 */
async function rolloutPanel(tmp, sample) {
  const root = path.join(tmp, 'canary');
  const src = path.join(REPO, 'models', 'digits', '1', 'model.onnx');
  for (const v of ['1', '2']) {
    fs.mkdirSync(path.join(root, v), { recursive: true });
    fs.symlinkSync(src, path.join(root, v, 'model.onnx'));
  }
  /* the reference: the sample digits as pixels.npy (a copy of the .npy file) */
  const ref = path.join(tmp, 'ref');
  fs.mkdirSync(ref);
  fs.copyFileSync(path.join(REPO, 'models', 'digits_sample.npy'), path.join(ref, 'pixels.npy'));
  fs.mkdirSync(path.join(root, '2', 'assets.extra'));
  const prof = spawnSync(KILN, ['profile', src, '--data', ref, '-o',
    path.join(root, '2', 'assets.extra', 'kiln_profile.json'), '--min-count', '20']);
  assert.equal(prof.status, 0, `kiln profile: ${prof.stderr}`);
  fs.writeFileSync(path.join(tmp, 'canary.config'),
    `model_config_list { config { name: 'digits' base_path: '${root}' model_platform: 'onnx'
      model_version_policy { all {} } } }\n`);
  fs.writeFileSync(path.join(tmp, 'canary.rollout'), `evaluation_interval_seconds: 1
model_rollouts { model_name: "digits"
  canary { candidate_version: 2 steps: [10, 50, 100] min_requests: 1000000 min_step_seconds: 3600
           gates { roll_back_on_input_drift: true } } }\n`);
  const srv = await startServer([`--model_config_file=${path.join(tmp, 'canary.config')}`,
    `--rollout_config_file=${path.join(tmp, 'canary.rollout')}`], tmp);
  const base = srv.base;
  let browser = null;
  try {
    /* some traffic, so the candidate's window has values to judge */
    const n = sample.shape[0];
    const body = JSON.stringify({ instances: Array.from({ length: 8 }, (_, i) => sample.data.slice((i % n) * 64, (i % n + 1) * 64)) });
    for (let i = 0; i < 60; i++) {
      const r = await post(base, '/v1/models/digits:predict', body);
      assert.equal(r.status, 200, r.text);
    }
    const udd = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-chromium-'));
    browser = await puppeteer.launch({
      executablePath: CHROMIUM, headless: true, userDataDir: udd,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', `--user-data-dir=${udd}`],
    });
    const page = await browser.newPage();
    await page.setViewport({ width: 1180, height: 820 });
    page.setDefaultTimeout(15000);
    const errors = [];
    page.on('pageerror', (e) => errors.push('pageerror: ' + e.message));
    await page.goto(base + '/console/#digits', { waitUntil: 'networkidle0' });
    await page.waitForSelector('#rollout-actions');
    await page.waitForSelector('#rollout table[data-section="drift"] tbody tr');
    const ro = (await (await fetch(base + '/v1/rollouts/digits')).json());
    assert.equal(await page.$eval('#rollout-state', (e) => e.textContent), ro.state);
    assert.equal(ro.state, 'progressing');
    assert.equal(await page.$eval('#rollout tr[data-field="step"] td', (e) => e.textContent),
      `${ro.step + 1} of ${ro.steps.length} (${ro.step_percent}%): steps ${ro.steps.join(', ')}`);
    assert.equal(await page.$eval('#rollout tr[data-field="weights"] td', (e) => e.textContent),
      ro.weights.map((w) => `v${w.version}: ${(100 * w.weight).toFixed(1)}%`).join(', '));
    const gates = await page.$$eval('#rollout table[data-section="gates"] tbody tr', (t) => t.map((r) => r.dataset.gate));
    assert.deepEqual(gates, ['error rate', 'p99 latency', 'input drift']);
    assert.equal(await page.$eval('#gates-verdict', (e) => e.textContent), ro.gates.evaluated ? ro.gates.verdict : 'not evaluated');
    /* the drift table == the monitoring view of version 2 */
    const mon = await (await fetch(base + '/v1/models/digits/monitoring')).json();
    const v2 = mon.versions.find((v) => v.version === 2);
    assert.ok(v2, 'version 2 is monitored');
    const drift = await page.$$eval('#rollout table[data-section="drift"][data-version="2"] tbody tr',
      (t) => t.map((r) => [r.dataset.feature, Number(r.cells[2].textContent)]));
    assert.deepEqual(drift.map((d) => d[0]), v2.features.map((f) => f.name), 'drift features');
    assert.ok(drift.every((d, i) => d[1] <= v2.features[i].window_count + 100 && d[1] >= 0), 'window counts');
    if (SHOTS) await page.screenshot({ path: path.join(SHOTS, 'console-rollout.png'), fullPage: true });
    /* the buttons: pause, then promote; the panel and the server agree (the
     * panel is redrawn on every poll: find and click in one step) */
    const press = (a) => page.$eval(`#rollout-actions button[data-action="${a}"]`, (b) => b.click());
    await press('pause');
    await page.waitForFunction(() => document.querySelector('#rollout-state').textContent === 'paused');
    assert.equal((await (await fetch(base + '/v1/rollouts/digits')).json()).state, 'paused');
    assert.match(await page.$eval('#rollout-message', (e) => e.textContent), /^pause: HTTP 200/);
    await press('promote');
    await page.waitForFunction(() => document.querySelector('#rollout-state').textContent === 'promoted');
    const after = (await (await fetch(base + '/v1/rollouts/digits')).json());
    assert.equal(after.state, 'promoted');
    assert.deepEqual(after.weights.map((w) => w.version), [2]);
    await page.waitForFunction(() => document.querySelector('#rollout tr[data-field="weights"] td').textContent === 'v2: 100.0%');
    const evs = await page.$$eval('#rollout table[data-section="events"] tbody tr', (t) => t.map((r) => r.dataset.event));
    assert.deepEqual(evs.slice(0, 2), ['promote', 'pause'], 'last events, newest first');
    /* a transition that does not apply: 409 with the server's reason */
    await press('resume');
    await page.waitForFunction(() => /^resume: HTTP 409/.test(document.querySelector('#rollout-message').textContent));
    assert.deepEqual(errors, [], 'page errors');
    log('rollout panel == /v1/rollouts and the monitoring view; pause and promote buttons act');
    await browser.close();
    browser = null;
    fs.rmSync(udd, { recursive: true, force: true });
  } finally {
    if (browser) await browser.close();
    await srv.stop();
  }
}

/* ------------------------------------------------------------ the test */

async function main() {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-console-'));
  const sample = readNpy(path.join(REPO, 'models', 'digits_sample.npy'));
  const labels = readNpy(path.join(REPO, 'models', 'digits_sample_labels.npy')).data;
  const row = (i) => sample.data.slice(i * 64, (i + 1) * 64);
  fs.writeFileSync(path.join(tmp, 'models.config'),
    `model_config_list { config { name: 'digits' base_path: '${path.join(REPO, 'models', 'digits')}'
      model_platform: 'tensorflow' version_labels { key: 'stable' value: 1 } } }\n`);
  fs.writeFileSync(path.join(tmp, 'batching.config'),
    'max_batch_size { value: 8 } batch_timeout_micros { value: 3000 } ' +
    'allowed_batch_sizes: 1 allowed_batch_sizes: 2 allowed_batch_sizes: 4 allowed_batch_sizes: 8\n');
  fs.writeFileSync(path.join(tmp, 'split.rollout'), 'model_rollouts { model_name: "digits" split { version: 1 weight: 1 } }\n');
  const srv = await startServer([`--model_config_file=${path.join(tmp, 'models.config')}`,
    `--rollout_config_file=${path.join(tmp, 'split.rollout')}`,
    '--enable_batching', `--batching_parameters_file=${path.join(tmp, 'batching.config')}`,
    '--rest_api_enable_cors_support',
    `--monitoring_config_file=${path.join(REPO, 'models', 'monitoring_config.txt')}`], tmp);
  const base = srv.base;
  let browser = null;
  try {
    /* the console's own replies: CSP, nosniff, CORS as the server is configured */
    for (const p of ['/console/', '/console/console.js', '/console/api/stats']) {
      const r = await fetch(base + p);
      assert.equal(r.status, 200, `GET ${p}`);
      const csp = r.headers.get('content-security-policy') || '';
      assert.match(csp, /default-src 'self'/, `${p}: CSP`);
      assert.match(csp, /script-src 'self'/, `${p}: CSP script-src`);
      assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|https?:/, `${p}: CSP allows too much`);
      assert.equal(r.headers.get('x-content-type-options'), 'nosniff');
      assert.equal(r.headers.get('access-control-allow-origin'), '*', `${p}: CORS header`);
    }
    const html = await (await fetch(base + '/console/')).text();
    assert.doesNotMatch(html, /<script(?![^>]*\bsrc=)[^>]*>/, 'inline script in index.html');
    assert.doesNotMatch(html, /(src|href)="(https?:)?\/\//, 'index.html names another host');
    const stats = await (await fetch(base + '/console/api/stats')).json();
    const v1 = stats.models[0].versions[0];
    assert.equal(stats.models[0].name, 'digits');
    assert.deepEqual(stats.models[0].labels, { stable: '1' });
    assert.equal(v1.state, 'AVAILABLE');
    assert.equal(v1.precision, 'fp32');
    assert.match(v1.load_log, /format=onnx/);
    assert.ok(v1.optimization_log.length > 0, 'optimization log empty');
    assert.equal(stats.requests.latency_bounds_us.length, 33);
    assert.ok(stats.batching && Array.isArray(stats.batching.series), 'batching stats');
    log('console replies and stats JSON ok');

    const udd = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-chromium-'));
    browser = await puppeteer.launch({
      executablePath: CHROMIUM,
      headless: true,
      userDataDir: udd,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
        '--disable-background-networking', '--disable-component-update', '--disable-sync',
        `--user-data-dir=${udd}`],
    });
    const page = await browser.newPage();
    await page.setViewport({ width: 1180, height: 820 });
    page.setDefaultTimeout(15000);
    const errors = [], requests = [];
    page.on('console', (m) => { if (m.type() === 'error') errors.push('console: ' + m.text()); });
    page.on('pageerror', (e) => errors.push('pageerror: ' + e.message));
    page.on('requestfailed', (r) => errors.push(`requestfailed: ${r.url()} ${r.failure() && r.failure().errorText}`));
    page.on('request', (r) => requests.push(r.url()));

    await page.goto(base + '/console/', { waitUntil: 'networkidle0' });
    await page.waitForSelector('#model-list li[data-model]');
    await page.waitForSelector('#signatures table.sig');
    await page.waitForSelector('#versions tbody tr[data-version]');

    /* model list == /v1/models */
    const list = await (await fetch(base + '/v1/models')).json();
    const shown = await page.$$eval('#model-list li[data-model]', (els) => els.map((e) => ({
      name: e.dataset.model, versions: e.querySelector('.versions-list').textContent })));
    assert.deepEqual(shown.map((m) => m.name), list.models.map((m) => m.name), 'model list');
    for (const m of list.models) {
      const avail = m.versions.filter((v) => v.state === 'AVAILABLE').map((v) => 'v' + v.version).join(', ');
      assert.equal(shown.find((s) => s.name === m.name).versions, avail, `versions of ${m.name}`);
    }
    /* versions table: state, label, precision; the optimization log is there */
    const vrow = await page.$eval('#versions tr[data-version="1"]', (tr) => [...tr.cells].map((c) => c.textContent));
    assert.equal(vrow[1].trim(), 'AVAILABLE');
    assert.equal(vrow[2], 'stable');
    assert.equal(vrow[3], 'fp32');
    const optlog = await page.$eval('details.optlog[data-version="1"] pre:last-child', (e) => e.textContent);
    assert.equal(optlog, v1.optimization_log);
    /* signatures == metadata */
    const md = await (await fetch(base + '/v1/models/digits/metadata')).json();
    const sigs = md.metadata.signature_def.signature_def;
    const rows = await page.$$eval('#signatures table.sig[data-signature="serving_default"] tbody tr',
      (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
    const want = [];
    for (const [kind, k] of [['input', 'inputs'], ['output', 'outputs']])
      for (const [alias, info] of Object.entries(sigs.serving_default[k]))
        want.push([kind, alias, info.dtype.replace('DT_', '').toLowerCase(),
          '[' + info.tensor_shape.dim.map((d) => (Number(d.size) < 0 ? '?' : d.size)).join(', ') + ']']);
    assert.deepEqual(rows, want, 'signature table');
    assert.deepEqual(rows, [['input', 'pixels', 'float', '[?, 64]'], ['output', 'probabilities', 'float', '[?, 10]']]);
    /* the rollout panel == /v1/rollouts (a static split here) */
    const split = (await (await fetch(base + '/v1/rollouts')).json()).rollouts[0];
    await page.waitForSelector('#rollout-state');
    assert.equal(await page.$eval('#rollout-state', (e) => e.textContent), split.state);
    assert.equal(await page.$eval('#rollout tr[data-field="weights"] td', (e) => e.textContent),
      split.weights.map((w) => `v${w.version}: ${(100 * w.weight).toFixed(1)}%`).join(', '));
    assert.equal(await page.$('#rollout-actions'), null, 'a static split has no canary buttons');
    log('page loaded: model list, versions, signatures, rollout panel ok');

    /* prediction: the prefilled example is valid; the form's reply == a direct one */
    await page.click('.tab[data-tab="predict"]');
    await page.waitForSelector('#predict-body');
    const example = await page.$eval('#predict-body', (e) => e.value);
    const ex = JSON.parse(example);
    assert.equal(ex.instances.length, 1);
    assert.deepEqual(ex.instances[0], new Array(64).fill(0), 'example request');
    const direct0 = await post(base, '/v1/models/digits:predict', example);
    assert.equal(direct0.status, 200, 'the example request is valid: ' + direct0.text);
    const send = async (body, version) => {
      if (version !== undefined) await page.select('#predict-version', version);
      await page.$eval('#predict-body', (e, v) => { e.value = v; }, body);
      await page.$eval('#predict-response', (e) => { e.dataset.status = ''; });
      await page.click('#predict-send');
      await page.waitForFunction(() => document.querySelector('#predict-response').dataset.status !== '');
      return page.$eval('#predict-response', (e) => ({ status: Number(e.dataset.status), text: e.textContent }));
    };
    const body0 = JSON.stringify({ instances: [row(0)] });
    const viaForm = await send(body0, 'labels/stable');
    const direct = await post(base, '/v1/models/digits/labels/stable:predict', body0);
    assert.equal(viaForm.status, 200);
    closeArrays(JSON.parse(viaForm.text), JSON.parse(direct.text), 1e-6, 'form vs direct');
    const probs = JSON.parse(direct.text).predictions[0];
    const argmax = probs.indexOf(Math.max(...probs));
    assert.equal(argmax, labels[0], 'digit 0 predicted');
    const top = await page.$eval('ol.bars li:first-child', (li) => Number(li.dataset.class));
    assert.equal(top, argmax, 'top bar');
    const nbars = await page.$$eval('ol.bars li', (l) => l.length);
    assert.equal(nbars, 10);
    log(`prediction from the form == direct request (digit ${argmax})`);

    /* an 8x8 PNG (dark ink on white) becomes the 64 inputs (0..16, ink high) */
    await page.select('#predict-version', '');
    const r1 = row(1);
    const png = grayPng(8, 8, r1.map((v) => Math.round(255 - (v * 255) / 16)));
    const pngPath = path.join(tmp, 'digit.png');
    fs.writeFileSync(pngPath, png);
    const before = await page.$eval('#predict-body', (e) => e.value);
    const fileInput = await page.$('input[type=file][data-input="pixels"]');
    await fileInput.uploadFile(pngPath);
    await page.waitForFunction((b) => document.querySelector('#predict-body').value !== b, {}, before);
    const fromImage = JSON.parse(await page.$eval('#predict-body', (e) => e.value)).instances[0];
    assert.equal(fromImage.length, 64);
    fromImage.forEach((v, i) => assert.ok(Math.abs(v - r1[i]) <= 0.05, `pixel ${i}: ${v} vs ${r1[i]}`));
    await page.click('#predict-send');
    await page.waitForFunction(() => document.querySelector('ol.bars li'));
    await page.waitForFunction((want) => Number(document.querySelector('ol.bars li').dataset.class) === want,
      {}, labels[1]);
    log(`dropped image -> 64 values within 0.05 of the digit, predicted ${labels[1]}`);
    if (SHOTS) await page.screenshot({ path: path.join(SHOTS, 'console-predict.png'), fullPage: true });

    /* live charts move under load */
    await page.click('.tab[data-tab="live"]');
    await page.waitForSelector('#chart-1-rate');
    const count0 = (await (await fetch(base + '/console/api/stats')).json())
      .requests.series.filter((s) => s.api === 'predict').reduce((a, s) => a + s.count, 0);
    /* 6 clients for 7 s; the checks and the screenshot happen while they run */
    const loadUntil = Date.now() + 7000;
    let sent = 0;
    const body = JSON.stringify({ instances: [row(2)] });
    const load = Promise.all(Array.from({ length: 6 }, async () => {
      while (Date.now() < loadUntil) {
        const r = await post(base, '/v1/models/digits:predict', body);
        assert.equal(r.status, 200);
        sent++;
        await sleep(5);
      }
    }));
    await sleep(4500);
    const sentSoFar = sent;
    await page.waitForFunction((n) => {
      const h = document.querySelector('.live-version[data-version="1"] h2 .muted');
      const m = h && /^(\d+) requests/.exec(h.textContent);
      return m && Number(m[1]) >= n;
    }, { timeout: 10000 }, count0 + sentSoFar);
    const last = async (id) => JSON.parse(await page.$eval(id, (e) => e.dataset.last));
    const rate = await last('#chart-1-rate');
    const lat = await last('#chart-1-latency');
    const batch = await last('#chart-1-batch');
    const queue = await last('#chart-1-queue');
    assert.ok(rate.requests > 0, `request rate under load: ${JSON.stringify(rate)}`);
    assert.ok(lat.p50 > 0 && lat.p99 >= lat.p50, `latency: ${JSON.stringify(lat)}`);
    assert.ok(batch.rows >= 1, `batch size: ${JSON.stringify(batch)}`);
    assert.ok(queue.p50 !== null, `queue time: ${JSON.stringify(queue)}`);
    const npoints = await page.$eval('#chart-1-rate polyline.s1', (e) => e.getAttribute('points').split(' ').length);
    assert.ok(npoints >= 2, 'rate line has points');
    log(`live charts under load: ${sentSoFar} requests seen, rate ${rate.requests.toFixed(1)}/s, ` +
      `p50 ${lat.p50.toFixed(2)} ms, mean batch ${batch.rows.toFixed(2)} rows`);
    if (SHOTS) await page.screenshot({ path: path.join(SHOTS, 'console-live.png'), fullPage: true });
    await load;
    if (SHOTS) { /* the overview after the load, with version 1's logs open */
      await page.click('.tab[data-tab="overview"]');
      await sleep(2500);
      await page.$eval('details.optlog[data-version="1"]', (d) => { d.open = true; });
      await page.screenshot({ path: path.join(SHOTS, 'console-overview.png'), fullPage: true });
    }

    /* so far: no console error, nothing outside this server */
    assert.deepEqual(errors, [], 'console errors');
    const foreign = requests.filter((u) => !u.startsWith(base + '/'));
    assert.deepEqual(foreign, [], 'requests to another host');
    log(`${requests.length} requests, all to ${base}; no console errors`);

    /* a server error is shown as the server wrote it */
    await page.click('.tab[data-tab="predict"]');
    const bad = '{"instances": [[1, 2, 3]]}';
    const shownErr = await send(bad, '');
    const directErr = await post(base, '/v1/models/digits:predict', bad);
    assert.equal(shownErr.status, directErr.status);
    assert.equal(directErr.status, 400);
    assert.equal(shownErr.text, directErr.text, 'error text verbatim');
    assert.ok(errors.every((e) => /status of 400/.test(e)), `unexpected errors: ${errors}`);
    log('server error shown verbatim: ' + directErr.text.trim());

    await browser.close();
    browser = null;
    fs.rmSync(udd, { recursive: true, force: true });
  } finally {
    if (browser) await browser.close();
    await srv.stop();
  }

  await rolloutPanel(tmp, sample);

  /* --enable_console=false: no console, no stats, the API still there */
  const off = await startServer(['--model_name=digits', `--model_base_path=${path.join(REPO, 'models', 'digits')}`,
    '--enable_console=false'], tmp);
  try {
    for (const p of ['/console', '/console/', '/console/api/stats', '/console/console.js'])
      assert.equal((await fetch(off.base + p)).status, 404, `GET ${p} with --enable_console=false`);
    assert.equal((await fetch(off.base + '/v1/models/digits')).status, 200);
  } finally {
    await off.stop();
  }
  log('--enable_console=false: 404 under /console');
  fs.rmSync(tmp, { recursive: true, force: true });
  log('PASS');
}

main().catch((e) => {
  console.error('FAIL:', e && e.stack ? e.stack : e);
  process.exit(1);
});
