// grpc_client.js - kiln serve's gRPC API through an independent client stack:
// @grpc/grpc-js (pure JavaScript HTTP/2) with stubs loaded by
// @grpc/proto-loader from Kiln's published schemas (src/import/proto/api).
// Usage: node grpc_client.js PORT. The server serves "aff" (y = x*[2,3,4] +
// [1,0.5,-1], float32 [batch,3]); expected values are computed here with
// Math.fround. Prints one "ok NAME" line per check; exits 1 on the first failure.
'use strict';
const path = require('path');
const assert = require('assert');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const API = path.resolve(__dirname, '../../src/import/proto/api');
const def = loader.loadSync(
  ['tensorflow_serving/apis/prediction_service.proto', 'tensorflow_serving/apis/model_service.proto',
   'grpc/health/v1/health.proto'],
  {includeDirs: [API], keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true});
const proto = grpc.loadPackageDefinition(def);
const target = `127.0.0.1:${process.argv[2]}`;
const prediction = new proto.tensorflow.serving.PredictionService(target, grpc.credentials.createInsecure(),
  {'grpc.max_receive_message_length': 256 << 20, 'grpc.max_send_message_length': 256 << 20});
const gzip = new proto.tensorflow.serving.PredictionService(target, grpc.credentials.createInsecure(),
  {'grpc.default_compression_algorithm': 2, 'grpc.max_receive_message_length': 256 << 20});
const models = new proto.tensorflow.serving.ModelService(target, grpc.credentials.createInsecure());
const health = new proto.grpc.health.v1.Health(target, grpc.credentials.createInsecure());

const A = [2, 3, 4], B = [1, 0.5, -1];
const affine = (x) => Array.from(x, (v, i) => Math.fround(Math.fround(v * A[i % 3]) + B[i % 3]));
const call = (client, method, req, opts = {}) => new Promise((resolve, reject) =>
  client[method](req, opts, (err, resp) => (err ? reject(err) : resolve(resp))));
const deadline = (ms) => ({deadline: new Date(Date.now() + ms)});

function tensor(x, rows) {
  return {dtype: 'DT_FLOAT', tensor_shape: {dim: [{size: rows}, {size: 3}]},
          tensor_content: Buffer.from(x.buffer, x.byteOffset, x.byteLength)};
}
function floats(t) {
  if (t.tensor_content && t.tensor_content.length)
    return new Float32Array(t.tensor_content.buffer.slice(t.tensor_content.byteOffset,
      t.tensor_content.byteOffset + t.tensor_content.length));
  return Float32Array.from(t.float_val);
}
function predictReq(x, rows, extra = {}) {
  return Object.assign({model_spec: {name: 'aff'}, inputs: {x: tensor(x, rows)}}, extra);
}
async function expectError(p, code, needle) {
  try {
    await p;
  } catch (e) {
    assert.strictEqual(e.code, code, `${e.code} ${e.details}`);
    if (needle) assert.ok(e.details.includes(needle), e.details);
    return;
  }
  assert.fail('expected an error');
}

async function main() {
  const x = Float32Array.from({length: 12}, (_, i) => (i - 5) * 0.37);
  let r = await call(prediction, 'Predict', predictReq(x, 4), deadline(10000));
  assert.deepStrictEqual(Array.from(floats(r.outputs.y)), affine(x));
  assert.strictEqual(r.model_spec.name, 'aff');
  assert.strictEqual(r.model_spec.version.value, 1);
  assert.strictEqual(r.model_spec.signature_name, 'serving_default');
  console.log('ok predict');

  r = await call(prediction, 'Predict', {model_spec: {name: 'aff'}, output_filter: ['y'], inputs: {x: {
    dtype: 'DT_FLOAT', tensor_shape: {dim: [{size: 2}, {size: 3}]}, float_val: [1, 2]}}});
  assert.deepStrictEqual(Object.keys(r.outputs), ['y']);
  assert.deepStrictEqual(Array.from(floats(r.outputs.y)), affine([1, 2, 2, 2, 2, 2]));
  console.log('ok typed_fields_repeat_last');

  const big = Float32Array.from({length: 3 * 400000}, (_, i) => (i % 1000) * 0.5);
  r = await call(gzip, 'Predict', predictReq(big, 400000, {output_filter: ['y']}), deadline(60000));
  const y = floats(r.outputs.y), want = affine(big);
  for (let i = 0; i < want.length; i++) assert.strictEqual(y[i], want[i]);
  console.log('ok large_gzip');

  const many = [];
  for (let i = 0; i < 100; i++) {
    const xi = Float32Array.from({length: 3}, (_, k) => i + k * 0.25);
    many.push(call(prediction, 'Predict', predictReq(xi, 1), deadline(30000))
      .then((resp) => assert.deepStrictEqual(Array.from(floats(resp.outputs.y)), affine(xi))));
  }
  await Promise.all(many);
  console.log('ok concurrent');

  await expectError(call(prediction, 'Predict', {model_spec: {name: 'nope'}, inputs: {x: tensor(x, 4)}}),
    grpc.status.NOT_FOUND, 'Servable not found for request: Latest(nope)');
  await expectError(call(prediction, 'Predict', {inputs: {x: tensor(x, 4)}}),
    grpc.status.INVALID_ARGUMENT, 'Missing ModelSpec');
  await expectError(call(prediction, 'Predict', predictReq(x, 4, {model_spec: {name: 'aff', signature_name: 's'}})),
    grpc.status.FAILED_PRECONDITION, 'Serving signature key "s" not found.');
  console.log('ok errors');

  const huge = new Float32Array(3 * 4000000);
  await expectError(call(prediction, 'Predict', predictReq(huge, 4000000, {output_filter: ['y']}), deadline(5)),
    grpc.status.DEADLINE_EXCEEDED);
  console.log('ok deadline');

  r = await call(prediction, 'GetModelMetadata', {model_spec: {name: 'aff'}, metadata_field: ['signature_def']});
  assert.strictEqual(r.metadata.signature_def.type_url, 'type.googleapis.com/tensorflow.serving.SignatureDefMap');
  const SDM = def['tensorflow.serving.SignatureDefMap'];
  assert.ok(SDM);
  console.log('ok metadata');

  r = await call(models, 'GetModelStatus', {model_spec: {name: 'aff'}});
  assert.strictEqual(r.model_version_status.length, 1);
  assert.strictEqual(r.model_version_status[0].version, 1);
  assert.strictEqual(r.model_version_status[0].state, 'AVAILABLE');
  console.log('ok status');

  r = await call(health, 'Check', {service: 'tensorflow.serving.PredictionService'});
  assert.strictEqual(r.status, 'SERVING');
  await new Promise((resolve, reject) => {
    const w = health.Watch({service: ''});
    w.on('data', (m) => { assert.strictEqual(m.status, 'SERVING'); w.cancel(); resolve(); });
    w.on('error', (e) => (e.code === grpc.status.CANCELLED ? resolve() : reject(e)));
  });
  console.log('ok health');
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
