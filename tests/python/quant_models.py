"""quant_models.py - small models made for the quantization tests (test_calibration.py,
test_compile.py)."""

import numpy as np


def outlier_cnn(path):
    """x -> conv1 (3x3, 4 -> 8) -> Relu -> conv2 (1x1, 8 -> 8) -> Relu -> conv3 (1x1, 8 -> 10)
    -> GlobalAveragePool -> logits. conv1's channel 0 carries a bias of 1000 that conv2 all but
    ignores (weights 1e-4 there): quantizing conv2's input to 8 bits over [0, ~1000] rounds the
    other channels away, so static int8 of the whole model loses its top-1, while conv2 kept in
    fp32 (its input then float: conv1 writes it unrounded) keeps it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(11)
    w1 = (rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32)
    b1 = np.zeros(8, np.float32)
    b1[0] = 1000.0
    w2 = (rng.standard_normal((8, 8, 1, 1)) * 0.5).astype(np.float32)
    w2[:, 0] = 1e-4
    w3 = (rng.standard_normal((10, 8, 1, 1)) * 0.5).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
         helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
         helper.make_node("Relu", ["c2"], ["r2"]),
         helper.make_node("Conv", ["r2", "w3"], ["c3"], name="conv3"),
         helper.make_node("GlobalAveragePool", ["c3"], ["p"]),
         helper.make_node("Flatten", ["p"], ["logits"])],
        "outlier", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 4, 6, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
         numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(w3, "w3")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return rng.standard_normal((64, 4, 6, 6)).astype(np.float32)
