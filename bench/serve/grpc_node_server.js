#!/usr/bin/env node
/*
 * grpc_node_server.js - the gRPC benchmark's peer (bench/serve/grpc_bench.py):
 * a Node.js gRPC server, @grpc/grpc-js with stubs that @grpc/proto-loader
 * builds from Kiln's published TF Serving schemas (src/import/proto/api),
 * around onnxruntime-node, answering tensorflow.serving.PredictionService/Predict:
 *
 *     PredictRequest{model_spec.name, inputs: {name: TensorProto}}
 *       -> ort.Tensor per input -> session.run -> PredictResponse{outputs}
 *
 *     node bench/serve/grpc_node_server.js MODEL.onnx NAME PORT [--threads T]
 *
 * Inputs are DT_FLOAT, in tensor_content (raw little-endian bytes) or
 * float_val (TF's rule: a field shorter than the shape repeats its last value).
 * Outputs are encoded as TF Serving (and Kiln by default) encode them: the
 * dtype's typed field (float_val, double_val, int_val, int64_val). Other
 * dtypes, an unknown model name or a bad tensor answer INVALID_ARGUMENT or
 * NOT_FOUND. The packages come from bench/package.json (npm ci in bench/).
 * One process, one InferenceSession configured as bench/serve/node_server.js
 * (the REST peer): graph optimization 'all', intra-op threads T (default the
 * number of CPUs), inter-op 1, sequential; session.run() works off the event
 * loop, so concurrent calls overlap their protobuf work with inference.
 */
'use strict';

const os = require('os');
const path = require('path');

const NODE_MODULES = path.join(__dirname, '..', 'node_modules');
const grpc = require(path.join(NODE_MODULES, '@grpc', 'grpc-js'));
const loader = require(path.join(NODE_MODULES, '@grpc', 'proto-loader'));
const ort = require(path.join(NODE_MODULES, 'onnxruntime-node'));

const API = path.resolve(__dirname, '..', '..', 'src', 'import', 'proto', 'api');

function usage(msg) {
  console.error(`grpc_node_server: ${msg}\nusage: grpc_node_server.js MODEL.onnx NAME PORT [--threads T]`);
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

class BadRequest extends Error {}

/* TensorProto (DT_FLOAT) -> ort.Tensor. */
function fromProto(key, t) {
  if (t.dtype !== 'DT_FLOAT') throw new BadRequest(`tensor parsing error: ${key} (dtype ${t.dtype}, only DT_FLOAT)`);
  const dims = (t.tensor_shape && t.tensor_shape.dim ? t.tensor_shape.dim : []).map((d) => Number(d.size));
  if (dims.some((d) => !(d >= 0))) throw new BadRequest(`tensor parsing error: ${key} (bad shape)`);
  const n = dims.reduce((a, b) => a * b, 1);
  let data;
  if (t.tensor_content && t.tensor_content.length) {
    const c = t.tensor_content;
    if (c.length !== n * 4) throw new BadRequest(`tensor parsing error: ${key} (${c.length} bytes for ${n} floats)`);
    /* a view when aligned, else one copy */
    data = c.byteOffset % 4 === 0 ? new Float32Array(c.buffer, c.byteOffset, n)
      : new Float32Array(c.buffer.slice(c.byteOffset, c.byteOffset + c.length));
  } else {
    const v = t.float_val || [];
    data = new Float32Array(n);
    for (let i = 0; i < n; i++) data[i] = v.length ? v[Math.min(i, v.length - 1)] : 0;
  }
  return new ort.Tensor('float32', data, dims);
}

const TYPED = {float32: ['DT_FLOAT', 'float_val'], float64: ['DT_DOUBLE', 'double_val'],
               int32: ['DT_INT32', 'int_val'], int64: ['DT_INT64', 'int64_val']};

/* ort.Tensor -> TensorProto with the dtype's typed field, as TF's AsProtoField. */
function toProto(t) {
  const ty = TYPED[t.type];
  if (!ty) throw new Error(`output type ${t.type} is not encoded here`);
  const out = {dtype: ty[0], tensor_shape: {dim: t.dims.map((d) => ({size: d}))}};
  out[ty[1]] = t.type === 'int64' ? Array.from(t.data, (v) => v.toString()) : Array.from(t.data);
  return out;
}

async function main() {
  const def = loader.loadSync(['tensorflow_serving/apis/prediction_service.proto'],
    {includeDirs: [API], keepCase: true, longs: String, enums: String, defaults: false, oneofs: true});
  const proto = grpc.loadPackageDefinition(def);
  const session = await ort.InferenceSession.create(modelPath, {
    graphOptimizationLevel: 'all', intraOpNumThreads: threads, interOpNumThreads: 1,
    executionMode: 'sequential',
  });
  const inputNames = new Set(session.inputNames);

  async function predict(call, done) {
    const req = call.request;
    if (!req.model_spec || req.model_spec.name !== name) {
      done({code: grpc.status.NOT_FOUND,
            details: `Servable not found for request: Latest(${req.model_spec ? req.model_spec.name : ''})`});
      return;
    }
    const feeds = {};
    try {
      for (const [k, t] of Object.entries(req.inputs || {})) {
        if (!inputNames.has(k)) throw new BadRequest(`input ${k} is not in the model`);
        feeds[k] = fromProto(k, t);
      }
      if (Object.keys(feeds).length !== inputNames.size) throw new BadRequest('input size does not match signature');
    } catch (e) {
      done({code: grpc.status.INVALID_ARGUMENT, details: String(e.message || e)});
      return;
    }
    try {
      const res = await session.run(feeds);
      const outputs = {};
      for (const k of session.outputNames) outputs[k] = toProto(res[k]);
      done(null, {model_spec: {name, version: {value: '1'}, signature_name: 'serving_default'}, outputs});
    } catch (e) {
      done({code: grpc.status.INTERNAL, details: String(e.message || e)});
    }
  }

  const server = new grpc.Server({'grpc.max_receive_message_length': 64 << 20,
                                  'grpc.max_concurrent_streams': 256});
  server.addService(proto.tensorflow.serving.PredictionService.service, {Predict: predict});
  server.bindAsync(`127.0.0.1:${port}`, grpc.ServerCredentials.createInsecure(), (err) => {
    if (err) {
      console.error(`grpc_node_server: ${err.message}`);
      process.exit(1);
    }
    console.error(`grpc_node_server: ${name} on 127.0.0.1:${port}, @grpc/grpc-js ` +
      `${require(path.join(NODE_MODULES, '@grpc', 'grpc-js', 'package.json')).version}, onnxruntime-node ` +
      `${require(path.join(NODE_MODULES, 'onnxruntime-node', 'package.json')).version}, ` +
      `intra-op threads ${threads}`);
  });
}

main().catch((e) => {
  console.error(`grpc_node_server: ${e.message || e}`);
  process.exit(1);
});
