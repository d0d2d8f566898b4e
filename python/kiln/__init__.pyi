# Type stubs of `import kiln`, Kiln's Python API (python/kiln/__init__.py and
# the C extension python/kiln/_kiln.c). See docs/PYTHON.md.
import enum
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

__version__: str
CPU_PROVIDER: str

class KilnError(RuntimeError):
    status: str  # kiln_status_name(), e.g. "INVALID_ARGUMENT"

class InvalidArgument(KilnError, ValueError): ...
class InvalidModel(KilnError): ...
class Unsupported(KilnError): ...
class NotFound(KilnError): ...
class FileError(KilnError): ...
class OutOfMemory(KilnError): ...
class RunFailed(KilnError): ...
class InternalError(KilnError): ...
class DeadlineExceeded(KilnError): ...

def get_available_providers() -> List[str]: ...
def get_device() -> str: ...
def input_copies() -> int: ...

class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99

class SessionOptions:
    intra_op_num_threads: int
    graph_optimization_level: GraphOptimizationLevel
    enable_optimization: bool
    max_tensor_bytes: int
    use_reference_kernels: bool
    saved_model_tags: Optional[str]
    enable_profiling: bool
    profile_file_prefix: str
    precision: str  # "fp32" (default), "bf16" or "int8"
    def __init__(self) -> None: ...

class RunOptions:
    timeout_ms: int
    terminate: bool
    def __init__(self, timeout_ms: int = 0) -> None: ...

Dim = Union[int, str, None]

class NodeArg:
    name: str
    type: str
    shape: Optional[List[Dim]]
    def __init__(self, name: str, type: str, shape: Optional[List[Dim]]) -> None: ...

class Signature:
    name: str
    method: str
    inputs: List[NodeArg]
    outputs: List[NodeArg]

Provider = Union[str, Tuple[str, Dict[str, Any]]]

class InferenceSession:
    def __init__(
        self,
        path_or_bytes: Union[str, bytes, bytearray, memoryview, os.PathLike],
        sess_options: Optional[SessionOptions] = None,
        providers: Optional[Sequence[Provider]] = None,
        provider_options: Optional[Sequence[Dict[str, Any]]] = None,
        *,
        signature: Optional[str] = None,
        precision: Optional[str] = None,  # "fp32", "bf16" or "int8"; None: sess_options'
    ) -> None: ...
    def get_inputs(self) -> List[NodeArg]: ...
    def get_outputs(self) -> List[NodeArg]: ...
    def get_providers(self) -> List[str]: ...
    def get_provider_options(self) -> Dict[str, Dict[str, Any]]: ...
    def get_session_options(self) -> SessionOptions: ...
    def run(
        self,
        output_names: Optional[Sequence[str]],
        input_feed: Mapping[str, Any],
        run_options: Optional[RunOptions] = None,
    ) -> List[Any]: ...  # arrays; a list of arrays for a sequence output, None for an empty optional
    @property
    def signature(self) -> str: ...
    @property
    def signatures(self) -> Dict[str, Signature]: ...
    def optimization_log(self) -> str: ...
    def precompile(self, batch_sizes: Sequence[int]) -> None: ...
    def enable_profiling(self, on: bool = True) -> None: ...
    def reset_profiling(self) -> None: ...
    def profile(self, by: str = "node") -> List[Dict[str, Any]]: ...
    def end_profiling(self) -> str: ...
    def model_info(self) -> Dict[str, Any]: ...
