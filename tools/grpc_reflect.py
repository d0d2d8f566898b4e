#!/usr/bin/python3
"""grpc_reflect.py - a gRPC client that needs no generated code: it asks the
server for its schema through server reflection (grpc.reflection.v1), then
builds the request and response classes from the descriptors it received.
For `kiln serve`'s gRPC API (or TF Serving's) where grpcurl is not at hand;
needs only python3-grpcio and python3-protobuf.

    grpc_reflect.py HOST:PORT list                  services the server offers
    grpc_reflect.py HOST:PORT describe SYMBOL       a service's methods, or a message's fields
    grpc_reflect.py HOST:PORT call SERVICE/METHOD JSON
        one unary call; the request is the proto3 JSON mapping of the method's
        input message (bytes as base64), the answer is printed the same way

    grpc_reflect.py localhost:8500 call tensorflow.serving.PredictionService/Predict \\
        '{"model_spec": {"name": "half"}, "inputs": {"x": {"dtype": "DT_FLOAT",
          "tensor_shape": {"dim": [{"size": 3}, {"size": 1}]}, "float_val": [1, 2, 5]}}}'

The reflection messages are few and simple, so they are written and read by
hand here (field numbers from grpc/reflection/v1/reflection.proto); the
FileDescriptorProtos they carry are read with google.protobuf. Exit status:
0, 1 on a gRPC error (code and message on stderr), 2 on bad usage.
"""

import json
import sys

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

REFLECTION = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"


def _varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _fields(buf):
    """(field number, value) for the length-delimited and varint fields of a message."""
    i, out = 0, []
    while i < len(buf):
        key, shift = 0, 0
        while True:
            b = buf[i]
            i += 1
            key |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, shift = 0, 0
            while True:
                b = buf[i]
                i += 1
                v |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
        elif wt == 2:
            n, shift = 0, 0
            while True:
                b = buf[i]
                i += 1
                n |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            v, i = bytes(buf[i:i + n]), i + n
        elif wt == 1:
            v, i = bytes(buf[i:i + 8]), i + 8
        elif wt == 5:
            v, i = bytes(buf[i:i + 4]), i + 4
        else:
            raise ValueError(f"wire type {wt} in a reflection answer")
        out.append((num, v))
    return out


class Reflection:
    """One reflection stream's worth of questions, and the descriptors learnt."""

    def __init__(self, channel):
        self.channel = channel
        self.files = {}  # name -> FileDescriptorProto

    def ask(self, field, text):
        """Send ServerReflectionRequest{field: text}; the answer's (number, value) fields."""
        req = _varint(field << 3 | 2) + _varint(len(text.encode())) + text.encode()
        info = self.channel.stream_stream(REFLECTION)
        for answer in info(iter([req]), timeout=30):
            for num, v in _fields(answer):
                if num == 7:  # error_response
                    err = dict(_fields(v))
                    raise LookupError(err.get(2, b"").decode() or f"reflection error {err.get(1)}")
                if num in (4, 6):
                    return num, v
        raise LookupError("no reflection answer")

    def services(self):
        _, v = self.ask(7, "*")  # list_services -> ListServiceResponse{service{name}}
        return [dict(_fields(s))[1].decode() for n, s in _fields(v) if n == 1]

    def load_symbol(self, symbol):
        """Fetch the file defining symbol and everything it imports."""
        _, v = self.ask(4, symbol)  # file_containing_symbol -> FileDescriptorResponse
        for n, raw in _fields(v):
            if n == 1:
                fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
                self.files.setdefault(fd.name, fd)

    def pool(self):
        """A descriptor pool holding every file learnt, dependencies first."""
        pool, added = descriptor_pool.DescriptorPool(), set()
        pending = dict(self.files)
        while pending:
            ready = [n for n, fd in pending.items() if all(d in added for d in fd.dependency)]
            if not ready:
                raise LookupError(f"files whose imports never came: {sorted(pending)}")
            for n in ready:
                pool.Add(pending.pop(n))
                added.add(n)
        return pool


def message_class(desc):
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(desc.file.pool).GetPrototype(desc)


def main(argv):
    if len(argv) < 3 or argv[2] not in ("list", "describe", "call"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    target, verb = argv[1], argv[2]
    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)]) as ch:
        r = Reflection(ch)
        try:
            if verb == "list":
                print("\n".join(sorted(r.services())))
                return 0
            if verb == "describe" and len(argv) == 4:
                r.load_symbol(argv[3])
                pool = r.pool()
                try:
                    svc = pool.FindServiceByName(argv[3])
                    for m in svc.methods:
                        print(f"rpc {m.name}({m.input_type.full_name}) returns ({m.output_type.full_name})")
                except KeyError:
                    msg = pool.FindMessageTypeByName(argv[3])
                    for f in msg.fields:
                        kind = f.message_type.full_name if f.message_type else f.type
                        print(f"{f.name} = {f.number} ({kind})")
                return 0
            if verb == "call" and len(argv) == 5 and "/" in argv[3]:
                service, method = argv[3].rsplit("/", 1)
                r.load_symbol(service)
                m = r.pool().FindServiceByName(service).methods_by_name[method]
                req_cls, resp_cls = message_class(m.input_type), message_class(m.output_type)
                req = json_format.Parse(argv[4], req_cls())
                call = ch.unary_unary(f"/{service}/{method}", request_serializer=req_cls.SerializeToString,
                                      response_deserializer=resp_cls.FromString)
                resp = call(req, timeout=60)
                print(json.dumps(json_format.MessageToDict(resp, preserving_proto_field_name=True), indent=1))
                return 0
        except grpc.RpcError as e:
            print(f"grpc_reflect: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
        except (LookupError, KeyError, json_format.ParseError) as e:
            print(f"grpc_reflect: {e}", file=sys.stderr)
            return 1
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
