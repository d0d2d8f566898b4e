#!/usr/bin/env node
/*
 * ort_overhead.js - ONNX Runtime's side of bench/python_overhead.py: the
 * per-call time of session.run() with onnxruntime-node (installed into
 * bench/node_modules by bench/run.sh, or `npm ci --ignore-scripts` in bench/)
 * on a small model at a fixed batch.
 *
 *     node bench/ort_overhead.js MODEL --input NAME --shape 1,64
 *          [--iterations K] [--warmup W] [--threads T]
 *
 * The float32 input is filled once (uniform in [-1, 1)) and reused; each
 * call is timed alone with process.hrtime.bigint(). Session options:
 * graphOptimizationLevel 'all', intraOpNumThreads T (default 1),
 * interOpNumThreads 1, sequential execution. Prints one JSON object:
 * {"runtime", "version", "iterations", "median_us", "p90_us", "min_us",
 * "mean_us"}.
 */
'use strict';

const ort = require('onnxruntime-node');
const ORT_VERSION = require('onnxruntime-node/package.json').version;

function parseArgs(argv) {
  const a = { iterations: 2000, warmup: 200, threads: 1 };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
      return argv[++i];
    };
    switch (arg) {
      case '--input': a.input = next(); break;
      case '--shape': a.shape = next().split(',').map((d) => parseInt(d, 10)); break;
      case '--iterations': a.iterations = parseInt(next(), 10); break;
      case '--warmup': a.warmup = parseInt(next(), 10); break;
      case '--threads': a.threads = parseInt(next(), 10); break;
      default:
        if (arg.startsWith('-') || a.model) throw new Error(`unexpected argument '${arg}'`);
        a.model = arg;
    }
  }
  if (!a.model || !a.input || !a.shape) throw new Error('usage: MODEL --input NAME --shape D0,D1');
  return a;
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const session = await ort.InferenceSession.create(a.model, {
    graphOptimizationLevel: 'all', intraOpNumThreads: a.threads, interOpNumThreads: 1,
    executionMode: 'sequential',
  });
  const n = a.shape.reduce((x, y) => x * y, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) data[i] = 2 * Math.random() - 1;
  const feeds = { [a.input]: new ort.Tensor('float32', data, a.shape) };
  for (let i = 0; i < a.warmup; i++) await session.run(feeds);
  const times = [];
  for (let i = 0; i < a.iterations; i++) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - t0) / 1000);
  }
  times.sort((x, y) => x - y);
  const q = (p) => times[Math.min(times.length - 1, Math.floor(p * times.length))];
  console.log(JSON.stringify({
    runtime: 'onnxruntime-node', version: ORT_VERSION, iterations: a.iterations,
    median_us: q(0.5), p90_us: q(0.9), min_us: times[0],
    mean_us: times.reduce((x, y) => x + y, 0) / times.length,
  }));
}

main().catch((e) => {
  console.error(`ort_overhead: ${e.message}`);
  process.exit(1);
});
