#!/usr/bin/env node
/*
 * node_server.js - the serving benchmark's Node.js peer: Node's http module
 * around onnxruntime-node (installed into bench/node_modules by bench/run.sh),
 * answering TF Serving's REST predict call for a single-input model:
 *
 *     POST /v1/models/<name>:predict   {"instances": [...]}  ->  {"predictions": [...]}
 *
 *     node bench/serve/node_server.js MODEL.onnx NAME PORT [--threads T]
 *
 * One process, one InferenceSession (graph optimization 'all', intra-op
 * threads T, default the number of CPUs, inter-op 1, sequential): what a
 * production user sets on a small machine. Each request is one
 * session.run(), which onnxruntime-node runs off the event loop, so
 * concurrent requests overlap their JSON work with inference.
 */
'use strict';

const http = require('http');
const os = require('os');
const path = require('path');

const ort = require(path.join(__dirname, '..', 'node_modules', 'onnxruntime-node'));

function usage(msg) {
  console.error(`node_server: ${msg}\nusage: node_server.js MODEL.onnx NAME PORT [--threads T]`);
  process.exit(2);
}

const argv = process.argv.slice(2);
let threads = os.cpus().length;
const pos = [];
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--threads') threads = parseInt(argv[++i], 10);
  else pos.push(argv[i]);
}
if (pos.length !== 3) usage('expected MODEL.onnx NAME PORT');
const [modelPath, name, portText] = pos;
const port = parseInt(portText, 10);
if (!(port > 0 && port < 65536)) usage(`bad PORT '${portText}'`);
if (!(threads >= 1)) usage('bad --threads');

/* Flatten nested arrays of numbers into a Float32Array, and the shape. */
function toTensor(instances) {
  const shape = [];
  for (let a = instances; Array.isArray(a); a = a[0]) shape.push(a.length);
  const n = shape.reduce((x, y) => x * y, 1);
  const data = new Float32Array(n);
  let k = 0;
  const walk = (a, depth) => {
    if (depth === shape.length) {
      if (typeof a !== 'number') throw new Error('instances must hold numbers');
      data[k++] = a;
      return;
    }
    if (!Array.isArray(a) || a.length !== shape[depth]) throw new Error('instances are ragged');
    for (const x of a) walk(x, depth + 1);
  };
  walk(instances, 0);
  return new ort.Tensor('float32', data, shape);
}

/* A tensor's data as nested arrays of its dims. */
function toNested(t) {
  const d = t.data;
  const dims = t.dims;
  let k = 0;
  const build = (depth) => {
    const out = new Array(dims[depth]);
    for (let i = 0; i < dims[depth]; i++) {
      out[i] = depth + 1 === dims.length ? Number(d[k++]) : build(depth + 1);
    }
    return out;
  };
  return dims.length === 0 ? Number(d[0]) : build(0);
}

function reply(res, code, obj) {
  const body = JSON.stringify(obj);
  res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}

async function main() {
  const session = await ort.InferenceSession.create(modelPath, {
    graphOptimizationLevel: 'all', intraOpNumThreads: threads, interOpNumThreads: 1,
    executionMode: 'sequential',
  });
  if (session.inputNames.length !== 1) throw new Error('only single-input models are served here');
  const inputName = session.inputNames[0];
  const outputName = session.outputNames[0];
  const predictUrl = `/v1/models/${name}:predict`;
  const statusUrl = `/v1/models/${name}`;

  const server = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url === statusUrl) {
      reply(res, 200, { model_version_status: [{ version: '1', state: 'AVAILABLE' }] });
      return;
    }
    if (req.method !== 'POST' || req.url !== predictUrl) {
      reply(res, 404, { error: `no route ${req.method} ${req.url}` });
      return;
    }
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      let x;
      try {
        const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        x = toTensor(body.instances);
      } catch (e) {
        reply(res, 400, { error: String(e.message || e) });
        return;
      }
      try {
        const out = await session.run({ [inputName]: x });
        reply(res, 200, { predictions: toNested(out[outputName]) });
      } catch (e) {
        reply(res, 500, { error: String(e.message || e) });
      }
    });
  });
  server.keepAliveTimeout = 120000;
  server.listen(port, '127.0.0.1', () => console.error(`node_server: ${name} on 127.0.0.1:${port}, ` +
    `onnxruntime-node ${require(path.join(__dirname, '..', 'node_modules', 'onnxruntime-node',
      'package.json')).version}, intra-op threads ${threads}`));
}

main().catch((e) => {
  console.error(`node_server: ${e.message || e}`);
  process.exit(1);
});
