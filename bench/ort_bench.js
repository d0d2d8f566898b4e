#!/usr/bin/env node
/*
 * ort_bench.js - ONNX Runtime's side of Kiln's benchmark: the same
 * measurements as `kiln bench --json`, with onnxruntime-node (installed into
 * bench/node_modules by bench/run.sh).
 *
 * Session options: graphOptimizationLevel 'all', intraOpNumThreads --threads
 * (default 2), interOpNumThreads 1, sequential execution.
 *
 * Timing mode:
 *     node bench/ort_bench.js MODEL --spec JSON --batch N [--threads T]
 *          [--iterations K] [--warmup W] [--seed S] [--int-high H]
 * --spec is the list of inputs with concrete shapes, as compare.py gets them
 * from the model's signature: [{"name": ..., "dtype": ..., "shape": [...]}].
 * Inputs are random by kiln bench's scheme (src/cli/cmd_bench.c): floats
 * uniform in [-1, 1), integers uniform in [0, H) (default 100) except inputs
 * whose name contains "mask", which are all 1, bools 0 or 1. (The generator
 * is not the same as Kiln's, so the values differ; the distribution is the
 * same.) load_ms is InferenceSession.create (which includes ONNX Runtime's
 * graph optimization), first_inference_ms the first run, then W warmup runs
 * and K recorded runs. Prints one JSON object with kiln bench's keys
 * (load_ms, first_inference_ms, load_to_first_inference_ms, median_ms, p90_ms,
 * p99_ms, mean_ms, min_ms, max_ms, throughput_per_s, peak_rss_mb) plus
 * base_rss_mb (the process's RSS before the model was loaded).
 *
 * Check mode:
 *     node bench/ort_bench.js MODEL --check INPUT_DIR --out OUT_DIR [--threads T]
 * runs the model once on INPUT_DIR/<input>.npy and writes OUT_DIR/<output>.npy.
 */
'use strict';

const fs = require('fs');
const path = require('path');

const ort = require('onnxruntime-node');
const ORT_VERSION = require('onnxruntime-node/package.json').version;
const BASE_RSS_MB = process.memoryUsage().rss / 1048576;

function parseArgs(argv) {
  const a = { threads: 2, iterations: 20, warmup: 2, seed: 1, intHigh: 100, batch: 1 };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
      return argv[++i];
    };
    switch (arg) {
      case '--spec': a.spec = JSON.parse(next()); break;
      case '--batch': a.batch = parseInt(next(), 10); break;
      case '--threads': a.threads = parseInt(next(), 10); break;
      case '--iterations': a.iterations = parseInt(next(), 10); break;
      case '--warmup': a.warmup = parseInt(next(), 10); break;
      case '--seed': a.seed = parseInt(next(), 10); break;
      case '--int-high': a.intHigh = parseInt(next(), 10); break;
      case '--check': a.check = next(); break;
      case '--out': a.out = next(); break;
      default:
        if (arg.startsWith('-') || a.model) throw new Error(`unexpected argument '${arg}'`);
        a.model = arg;
    }
  }
  if (!a.model) throw new Error('missing MODEL');
  if (!a.check && !a.spec) throw new Error('give --spec JSON (timing) or --check DIR --out DIR');
  if (a.check && !a.out) throw new Error('--check needs --out DIR');
  if (!(a.iterations >= 1)) throw new Error('--iterations must be >= 1');
  return a;
}

/* mulberry32: a small 32-bit generator; uniform in [0, 1). */
function makeRandom(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/* A random ort.Tensor for one spec entry, by kiln bench's scheme. */
function randomTensor(spec, random, intHigh) {
  const n = spec.shape.reduce((x, y) => x * y, 1);
  const mask = /mask/i.test(spec.name);
  const ints = (Arr, conv) => {
    const d = new Arr(n);
    for (let i = 0; i < n; i++) d[i] = conv(mask ? 1 : Math.floor(random() * intHigh));
    return d;
  };
  let data;
  switch (spec.dtype) {
    case 'float32':
    case 'float64':
      data = spec.dtype === 'float32' ? new Float32Array(n) : new Float64Array(n);
      for (let i = 0; i < n; i++) data[i] = 2 * random() - 1;
      break;
    case 'int64': data = ints(BigInt64Array, BigInt); break;
    case 'int32': data = ints(Int32Array, Number); break;
    case 'int16': data = ints(Int16Array, Number); break;
    case 'int8': data = ints(Int8Array, Number); break;
    case 'uint8': data = ints(Uint8Array, Number); break;
    case 'bool':
      data = new Uint8Array(n);
      for (let i = 0; i < n; i++) data[i] = random() < 0.5 ? 0 : 1;
      break;
    default: throw new Error(`input '${spec.name}': dtype ${spec.dtype} is not supported here`);
  }
  return new ort.Tensor(spec.dtype, data, spec.shape);
}

/* ------------------------------------------------------------- .npy */

const NPY_TYPES = {
  '<f4': ['float32', Float32Array], '<f8': ['float64', Float64Array],
  '<i8': ['int64', BigInt64Array], '<i4': ['int32', Int32Array], '<i2': ['int16', Int16Array],
  '|i1': ['int8', Int8Array], '|u1': ['uint8', Uint8Array], '|b1': ['bool', Uint8Array],
};

function readNpy(file) {
  const buf = fs.readFileSync(file);
  if (buf.toString('latin1', 0, 6) !== '\x93NUMPY') throw new Error(`${file}: not a .npy file`);
  const major = buf[6];
  const hlen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = major === 1 ? 10 : 12;
  const header = buf.toString('latin1', start, start + hlen);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  if (/'fortran_order':\s*True/.test(header)) throw new Error(`${file}: Fortran order`);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map((s) => s.trim())
    .filter((s) => s).map(Number);
  const t = NPY_TYPES[descr];
  if (!t) throw new Error(`${file}: dtype ${descr} is not supported here`);
  const body = buf.subarray(start + hlen);
  const copy = new Uint8Array(body.length); /* aligned for the typed array */
  copy.set(body);
  return new ort.Tensor(t[0], new t[1](copy.buffer), shape);
}

function writeNpy(file, tensor) {
  const descr = Object.keys(NPY_TYPES).find((k) => NPY_TYPES[k][0] === tensor.type);
  if (!descr) throw new Error(`output dtype ${tensor.type} is not supported here`);
  const shape = tensor.dims.length === 1 ? `(${tensor.dims[0]},)` : `(${tensor.dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  header += ' '.repeat(63 - ((10 + header.length) % 64)) + '\n';
  const pre = Buffer.alloc(10);
  Buffer.from('\x93NUMPY', 'latin1').copy(pre, 0);
  pre[6] = 1; pre[7] = 0; pre.writeUInt16LE(header.length, 8);
  const d = tensor.data;
  fs.writeFileSync(file, Buffer.concat([pre, Buffer.from(header, 'latin1'),
    Buffer.from(d.buffer, d.byteOffset, d.byteLength)]));
}

/* ------------------------------------------------------------- timing */

/* Peak RSS in MiB: VmHWM (not carried across exec, unlike maxRSS; see
 * peak_rss_mb in src/cli/cmd_bench.c), else maxRSS. */
function peakRssMb() {
  try {
    const m = /VmHWM:\s*(\d+)\s*kB/.exec(fs.readFileSync('/proc/self/status', 'latin1'));
    if (m) return Number(m[1]) / 1024;
  } catch (e) { /* no /proc */ }
  return process.resourceUsage().maxRSS / 1024;
}

function nowMs() { return Number(process.hrtime.bigint()) / 1e6; }

/* numpy.percentile's default: linear between the two nearest ranks. */
function percentile(sorted, p) {
  const pos = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(pos), hi = Math.min(lo + 1, sorted.length - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const opts = {
    graphOptimizationLevel: 'all', intraOpNumThreads: a.threads, interOpNumThreads: 1,
    executionMode: 'sequential',
  };
  if (a.check) {
    const session = await ort.InferenceSession.create(a.model, opts);
    const feeds = {};
    for (const name of session.inputNames) feeds[name] = readNpy(path.join(a.check, `${name}.npy`));
    const out = await session.run(feeds);
    fs.mkdirSync(a.out, { recursive: true });
    for (const name of session.outputNames) writeNpy(path.join(a.out, `${name}.npy`), out[name]);
    console.log(JSON.stringify({ runtime: 'onnxruntime', outputs: session.outputNames }));
    return;
  }

  const random = makeRandom(a.seed);
  const feeds = {};
  for (const spec of a.spec) feeds[spec.name] = randomTensor(spec, random, a.intHigh);

  let t0 = nowMs();
  const session = await ort.InferenceSession.create(a.model, opts);
  const loadMs = nowMs() - t0;
  t0 = nowMs();
  await session.run(feeds);
  const firstMs = nowMs() - t0;
  for (let i = 0; i < a.warmup; i++) await session.run(feeds);
  const lat = [];
  for (let i = 0; i < a.iterations; i++) {
    t0 = nowMs();
    await session.run(feeds);
    lat.push(nowMs() - t0);
  }
  const mean = lat.reduce((x, y) => x + y, 0) / lat.length;
  lat.sort((x, y) => x - y);
  const median = percentile(lat, 50);
  const r = {
    runtime: 'onnxruntime', version: ORT_VERSION, model: a.model, batch: a.batch,
    threads: a.threads, iterations: a.iterations, warmup: a.warmup, inputs: a.spec,
    load_ms: loadMs, first_inference_ms: firstMs, load_to_first_inference_ms: loadMs + firstMs,
    median_ms: median, p90_ms: percentile(lat, 90), p99_ms: percentile(lat, 99), mean_ms: mean,
    min_ms: lat[0], max_ms: lat[lat.length - 1], throughput_per_s: (a.batch * 1000) / median,
    peak_rss_mb: peakRssMb(), base_rss_mb: BASE_RSS_MB,
  };
  console.log(JSON.stringify(r));
}

main().catch((e) => {
  console.error(`ort_bench: ${e.message || e}`);
  process.exit(1);
});
