"""kiln - run ONNX models and TensorFlow SavedModels from Python with Kiln.

The API has ONNX Runtime's shape, so that code written for onnxruntime
switches by changing its import::

    import kiln as ort          # was: import onnxruntime as ort
    sess = ort.InferenceSession("model.onnx")
    name = sess.get_inputs()[0].name
    (probs,) = sess.run(None, {name: x})

plus what Kiln adds: SavedModel signatures (``InferenceSession(path,
signature="name")``, ``session.signatures``), the optimizer's log
(``session.optimization_log()``), ahead-of-time plan compilation
(``session.precompile([1, 8, 32])``), per-run deadlines and
cancellation (``RunOptions``), and per-op timings as data
(``session.profile()``, with ``SessionOptions.enable_profiling``).

This module is the Python layer; the work is done by the C extension
kiln._kiln over libkiln's public C API (include/kiln/kiln.h): inputs are
read in place when numpy's layout allows, outputs are handed to numpy
without a copy, and the GIL is released while a model loads or runs.
See docs/PYTHON.md for the whole API.
"""

import enum
import json
import os
import time
import warnings

from . import _kiln
from ._kiln import (
    DeadlineExceeded,
    FileError,
    InternalError,
    InvalidArgument,
    InvalidModel,
    KilnError,
    NotFound,
    OutOfMemory,
    RunFailed,
    RunOptions,
    Unsupported,
    input_copies,
)

__version__ = _kiln.version()

__all__ = [
    "InferenceSession", "SessionOptions", "GraphOptimizationLevel", "RunOptions", "NodeArg",
    "Signature", "get_available_providers", "get_device", "input_copies",
    "KilnError", "InvalidArgument", "InvalidModel", "Unsupported", "NotFound", "FileError",
    "OutOfMemory", "RunFailed", "InternalError", "DeadlineExceeded",
]

#: The one execution provider: Kiln runs on the CPU (its own kernels, SIMD
#: and oneDNN). It is reported under ONNX Runtime's name so that code which
#: checks for it, or passes providers=["CPUExecutionProvider"], works as is.
CPU_PROVIDER = "CPUExecutionProvider"


def get_available_providers():
    """The execution providers Kiln offers: ``["CPUExecutionProvider"]``."""
    return [CPU_PROVIDER]


def get_device():
    """The device Kiln runs on: ``"CPU"``."""
    return "CPU"


class GraphOptimizationLevel(enum.IntEnum):
    """ONNX Runtime's optimization levels. Kiln's optimizer is on or off:
    ORT_DISABLE_ALL runs the graph as imported; every other level runs
    Kiln's whole optimizer."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


class SessionOptions:
    """Options of an InferenceSession (kiln_session_options).

    Attributes:
        intra_op_num_threads: threads a run may use; 0 = the machine's cores.
        graph_optimization_level: a GraphOptimizationLevel; ORT_DISABLE_ALL
            turns Kiln's optimizer off, any other level turns it on.
        enable_optimization: the same switch as a bool.
        max_tensor_bytes: bound on any one tensor a run produces; a run that
            would exceed it raises OutOfMemory. 0 = Kiln's default (16 GiB).
        use_reference_kernels: run the imported graph on Kiln's plain
            reference kernels (slow; for checking the fast path).
        saved_model_tags: SavedModel MetaGraph tags, comma-separated
            (None = "serve").
        enable_profiling: time every step of every run from the start
            (ONNX Runtime's name); read with InferenceSession.profile(),
            write a trace with end_profiling(). Off by default.
        profile_file_prefix: the start of the trace file's name that
            end_profiling() writes (ONNX Runtime's name); default
            "kiln_profile".
        precision: the compute precision, "fp32" (default), "bf16" or
            "int8" (dynamic quantization); opt-in and lossy, see
            docs/COMPRESSION.md. A .kiln file runs in the precision it was
            compiled in. Another value is InvalidArgument (a ValueError)
            when the session is created.
    """

    __slots__ = ("intra_op_num_threads", "_optimize", "max_tensor_bytes",
                 "use_reference_kernels", "saved_model_tags", "enable_profiling",
                 "profile_file_prefix", "precision")

    def __init__(self):
        self.intra_op_num_threads = 0
        self._optimize = True
        self.max_tensor_bytes = 0
        self.use_reference_kernels = False
        self.saved_model_tags = None
        self.enable_profiling = False
        self.profile_file_prefix = "kiln_profile"
        self.precision = "fp32"

    @property
    def graph_optimization_level(self):
        return (GraphOptimizationLevel.ORT_ENABLE_ALL if self._optimize
                else GraphOptimizationLevel.ORT_DISABLE_ALL)

    @graph_optimization_level.setter
    def graph_optimization_level(self, level):
        self._optimize = int(level) != GraphOptimizationLevel.ORT_DISABLE_ALL

    @property
    def enable_optimization(self):
        return self._optimize

    @enable_optimization.setter
    def enable_optimization(self, on):
        self._optimize = bool(on)

    def __repr__(self):
        return ("SessionOptions(intra_op_num_threads=%d, enable_optimization=%s, "
                "max_tensor_bytes=%d, use_reference_kernels=%s, saved_model_tags=%r, "
                "enable_profiling=%s, precision=%r)"
                % (self.intra_op_num_threads, self._optimize, self.max_tensor_bytes,
                   self.use_reference_kernels, self.saved_model_tags, bool(self.enable_profiling),
                   self.precision))


class NodeArg:
    """An input or output of a signature, as ONNX Runtime describes one.

    Attributes:
        name: the name run() and input_feed use.
        type: ONNX Runtime's type string, e.g. ``"tensor(float)"``.
        shape: a list with one entry per dimension: an int where fixed, the
            symbol (str) where symbolic, None where unknown; None itself
            when the rank is unknown.
    """

    __slots__ = ("name", "type", "shape")

    def __init__(self, name, type, shape):
        self.name = name
        self.type = type
        self.shape = shape

    def __repr__(self):
        return "NodeArg(name=%r, type=%r, shape=%r)" % (self.name, self.type, self.shape)

    def __eq__(self, other):
        return (isinstance(other, NodeArg) and
                (self.name, self.type, self.shape) == (other.name, other.type, other.shape))

    __hash__ = None


class Signature:
    """A named entry point of a model (a SavedModel may have several; an
    ONNX model has one, "serving_default").

    Attributes:
        name: the signature's key.
        method: its method name, e.g. ``"tensorflow/serving/predict"``.
        inputs, outputs: lists of NodeArg.
    """

    __slots__ = ("name", "method", "inputs", "outputs")

    def __init__(self, name, method, inputs, outputs):
        self.name = name
        self.method = method
        self.inputs = inputs
        self.outputs = outputs

    def __repr__(self):
        return "Signature(name=%r, method=%r, inputs=%r, outputs=%r)" % (
            self.name, self.method, self.inputs, self.outputs)


def _node_args(tuples):
    return [NodeArg(n, t, s) for n, t, s in tuples]


def _check_providers(providers):
    if providers is None:
        return
    for p in providers:
        name = p[0] if isinstance(p, (tuple, list)) else p
        if name != CPU_PROVIDER:
            warnings.warn("Specified provider '%s' is not in available provider names. "
                          "Available providers: '%s'" % (name, CPU_PROVIDER), stacklevel=3)


class InferenceSession(_kiln.Session):
    """InferenceSession(path_or_bytes, sess_options=None, providers=None,
    provider_options=None, *, signature=None, precision=None)

    A model loaded by Kiln, ready to run one of its signatures.

    Args:
        path_or_bytes: an .onnx file, a SavedModel folder (str or
            os.PathLike), or the bytes of an ONNX model.
        sess_options: a SessionOptions, or None for the defaults.
        providers, provider_options: accepted for ONNX Runtime
            compatibility; Kiln has one provider, "CPUExecutionProvider",
            and warns about any other.
        signature: the SavedModel signature to run (None = the model's
            default, "serving_default").
        precision: "fp32", "bf16" or "int8" (None = sess_options.precision,
            "fp32" by default): the compute precision, opt-in and lossy
            (docs/COMPRESSION.md).

    Raises:
        NotFound, FileError, InvalidModel, Unsupported (KilnError
        subclasses) with Kiln's message when the model cannot be loaded;
        InvalidArgument (also a ValueError) for a precision that is not
        "fp32", "bf16" or "int8".
    """

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None,
                 *, signature=None, precision=None):
        _check_providers(providers)
        so = sess_options if sess_options is not None else SessionOptions()
        self._sess_options = so
        if precision is None:
            precision = getattr(so, "precision", None)
        if precision is not None and not isinstance(precision, str):
            raise InvalidArgument("precision must be 'fp32', 'bf16' or 'int8', got %r"
                                  % (precision,))
        super().__init__(path_or_bytes, signature=signature, precision=precision,
                         threads=int(so.intra_op_num_threads),
                         optimize=1 if so.enable_optimization else 0,
                         max_tensor_bytes=int(so.max_tensor_bytes),
                         reference=1 if so.use_reference_kernels else 0,
                         tags=so.saved_model_tags,
                         profile=bool(so.enable_profiling))
        self._profiling = bool(so.enable_profiling)
        self._inputs_cache = _node_args(self._inputs())
        self._outputs_cache = _node_args(self._outputs())

    def get_inputs(self):
        """The signature's inputs, a list of NodeArg."""
        return list(self._inputs_cache)

    def get_outputs(self):
        """The signature's outputs, a list of NodeArg."""
        return list(self._outputs_cache)

    def get_providers(self):
        """``["CPUExecutionProvider"]``: Kiln's one provider, the CPU."""
        return [CPU_PROVIDER]

    def get_provider_options(self):
        """``{"CPUExecutionProvider": {}}`` (Kiln's CPU provider has no options)."""
        return {CPU_PROVIDER: {}}

    def get_session_options(self):
        """The SessionOptions this session was created with."""
        return self._sess_options

    @property
    def signature(self):
        """The name of the signature this session runs."""
        return self._signature_name()

    @property
    def signatures(self):
        """Every signature of the model, a dict of name -> Signature (the
        session runs one of them; create another session to run another)."""
        return {name: Signature(name, method, _node_args(ins), _node_args(outs))
                for name, method, ins, outs in self._signatures()}

    def model_info(self):
        """Facts about the loaded model: format ("onnx" or "savedmodel"),
        param_count, param_bytes, node_count, ir_version, producer, opsets
        (domain -> version) and ops (op name -> count)."""
        return self._model_info()

    def enable_profiling(self, on=True):
        """Turn per-step timing on (or off) for this session's later runs.

        Raises Unsupported for a session on the reference kernels, which
        keeps no profile."""
        self._profile_enable(bool(on))
        self._profiling = bool(on)

    def reset_profiling(self):
        """Zero the profile's counters (profiling stays on or off as it is)."""
        self._profile_reset()

    def profile(self, by="node"):
        """The time spent per step since profiling began (or the last
        reset_profiling()), as a list of dicts, slowest first.

        Args:
            by: "node" for one entry per step of each compiled plan (one plan
                per input shape), "op" for one per op type and kernel.

        Each dict has op_type, node_name (None for a by="op" entry), kernel
        (the kernel that ran it, "reference" for Kiln's reference kernel),
        calls (times it ran; summed over the nodes of an op entry),
        total_ns, share (of the profile's total time, 0..1), flops
        (floating-point operations per call where Kiln counts them, else
        0), nodes (steps counted), plan and step (-1 for op entries).

        Empty when profiling is off (SessionOptions.enable_profiling or
        enable_profiling()). The steps are those of the optimized graph
        (fused ops appear under their fused names) unless optimization is
        off. Sessions of one model share their plans' counters; separate
        InferenceSession objects each load their own model.
        """
        if by not in ("node", "op"):
            raise InvalidArgument("profile(by=%r): by is \"node\" or \"op\"" % (by,))
        return self._profile(by == "op")

    def end_profiling(self):
        """Write the profile as a Chrome trace (chrome://tracing, Perfetto)
        and turn profiling off, as ONNX Runtime does; returns the file's
        path, "<profile_file_prefix>_<date>_<time>.json" in the current
        folder, or "" when profiling was off.

        Difference from ONNX Runtime: Kiln keeps a total per step, not one
        event per run, so the trace holds one run's worth of "X" events laid
        end to end in step order, each lasting the step's mean time per call
        (args: op_name, kernel, calls, total_us, share, flops).
        """
        if not self._profiling:
            return ""
        steps = sorted(self._profile(False), key=lambda e: (e["plan"], e["step"]))
        events, ts = [], {}
        for e in steps:
            dur = e["total_ns"] / e["calls"] / 1000.0 if e["calls"] else 0.0
            start = ts.get(e["plan"], 0.0)
            events.append({
                "cat": "Node", "ph": "X", "pid": os.getpid(), "tid": e["plan"],
                "name": e["node_name"] or "%s_%d" % (e["op_type"], e["step"]),
                "ts": start, "dur": dur,
                "args": {"op_name": e["op_type"], "kernel": e["kernel"], "calls": e["calls"],
                         "total_us": e["total_ns"] / 1000.0, "share": e["share"],
                         "flops": e["flops"]},
            })
            ts[e["plan"]] = start + dur
        prefix = self._sess_options.profile_file_prefix or "kiln_profile"
        base = "%s_%s" % (prefix, time.strftime("%Y-%m-%d_%H-%M-%S"))
        path, n = base + ".json", 1
        while os.path.exists(path):
            path, n = "%s_%d.json" % (base, n), n + 1
        with open(path, "w") as f:
            json.dump(events, f)
        self.enable_profiling(False)
        return path

    def __repr__(self):
        return "<kiln.InferenceSession signature=%r inputs=%r outputs=%r>" % (
            self.signature, [a.name for a in self._inputs_cache],
            [a.name for a in self._outputs_cache])
