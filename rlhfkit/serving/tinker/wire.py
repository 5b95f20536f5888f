"""The SDK's protobuf messages <-> plain Python: `forward_backward` requests in, the
`ForwardBackwardOutput` and `SampleResponse` answers out (the SDK only accepts those two as
protobuf, `Accept: application/x-protobuf`). The message classes come from the installed SDK
(`tinker.proto.tinker_public_pb2`), so the server speaks exactly the version the extra pins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlhfkit.errors import DataError


def _pb():
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


@dataclass
class WireImage:
    """One image chunk of a ModelInput as the client sent it: the encoded image, its format and the
    number of tokens the client counts for it (None: not given); serving.tinker.images expands it."""

    data: bytes
    format: str
    expected_tokens: int | None = None


@dataclass
class WireDatum:
    """One datum: input tokens [T] and its loss inputs (name -> array). A datum with images holds
    a WireImage in `tokens` where each image chunk sits until the host expands it to the image's
    tokens (setting `vision`, its images' tensors)."""

    tokens: list
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    vision: object = None


@dataclass
class FwdBwdRequest:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


def _dtype(pb, code: int) -> np.dtype:
    table = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if code not in table:
        raise DataError(f"loss_fn_inputs: tensor dtype {code} is not float32 / int64 / int32")
    return np.dtype(table[code])


def tensor_to_numpy(msg, name: str) -> np.ndarray:
    """A proto `Tensor` (dense, or sparse CSR of a 2-D tensor / CSR of a 1-D one) as an array."""
    pb = _pb()
    dtype = _dtype(pb, msg.dtype)
    shape = tuple(int(s) for s in msg.shape)
    try:
        if msg.HasField("sparse_csr"):
            values = np.frombuffer(msg.sparse_csr.values, dtype=dtype)
            crow = np.frombuffer(msg.sparse_csr.crow_indices, dtype=np.int64)
            cols = np.frombuffer(msg.sparse_csr.col_indices, dtype=np.int64)
            rows_shape = shape if len(shape) == 2 else (1, int(np.prod(shape)))
            dense = np.zeros(rows_shape, dtype=dtype)
            for r in range(len(crow) - 1):
                dense[r, cols[crow[r]:crow[r + 1]]] = values[crow[r]:crow[r + 1]]
            return dense.reshape(shape)
        arr = np.frombuffer(msg.dense, dtype=dtype)
        return arr.reshape(shape) if shape else arr
    except (ValueError, IndexError) as exc:
        raise DataError(f"loss_fn_inputs[{name!r}]: its bytes do not fit shape {list(shape)} ({exc})") from exc


def _datum_tokens(datum_msg) -> list:
    """The datum's tokens, each image chunk a WireImage in its place."""
    tokens: list = []
    for chunk in datum_msg.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind == "image":
            image = chunk.image
            if image.HasField("override_dimensions"):
                raise DataError("model_input: an image chunk with override_dimensions; this server takes images "
                                "at their own size")
            expected = int(image.expected_tokens) if image.HasField("expected_tokens") else None
            tokens.append(WireImage(bytes(image.data), image.format, expected))
        elif kind == "encoded_text":
            tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
        else:
            raise DataError(f"model_input: a {kind} chunk; this server takes text (EncodedTextChunk) and image "
                            "(ImageChunk) chunks")
    return tokens


def parse_forward_backward(body: bytes) -> FwdBwdRequest:
    """A serialized `ForwardBackwardRequest` as a FwdBwdRequest (DataError when it does not parse)."""
    pb = _pb()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError
        raise DataError(f"forward_backward: the body is not a ForwardBackwardRequest protobuf ({exc})") from exc
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = [WireDatum(tokens=_datum_tokens(d),
                      inputs={k: tensor_to_numpy(t, k) for k, t in d.loss_fn_inputs.items()})
            for d in msg.data]
    return FwdBwdRequest(model_id=msg.model_id, seq_id=int(msg.seq_id), loss_fn=msg.loss_fn, config=config,
                         forward_only=bool(msg.forward_only), data=data)


def forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A serialized `ForwardBackwardOutput`: one ArrayRecord holding every datum's float32
    arrays (each field one BatchedTensor with byte offsets per datum)."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    if outputs:
        record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(outputs))
        for name in outputs[0]:
            arrays = [np.ascontiguousarray(o[name], dtype=np.float32).reshape(-1) for o in outputs]
            offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
            bt = record.fields[name]
            bt.data = b"".join(a.tobytes() for a in arrays)
            bt.offsets = offsets.tobytes()
            bt.dtype = pb.DTYPE_FLOAT32
    return msg.SerializeToString()


@dataclass
class TopK:
    """The k most likely tokens at each of L positions: `ids` int32 [L, k] and their `logprobs`
    float32 [L, k], most likely first; a position not computed holds the SDK's sentinel (token 0,
    logprob TOPK_MASK), which the SDK reads as None."""

    ids: np.ndarray
    logprobs: np.ndarray


TOPK_MASK = -99999.0  # the SDK's sentinel logprob of an empty top-k cell (tinker.types.topk_logprobs)


@dataclass
class SampleOptions:
    """What a sample request asks for besides the samples: prompt logprobs, and the top-k logprobs
    (k = 0: none) at each prompt position and at each sampled position."""

    prompt_logprobs: bool = False
    topk_prompt: int = 0
    topk_sample: int = 0


@dataclass
class Sequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" or "length"
    topk: TopK | None = None


def _topk_message(pb, topk: TopK):
    length, k = topk.ids.shape
    return pb.TopkLogprobs(token_ids=np.ascontiguousarray(topk.ids, dtype=np.int32).tobytes(),
                           logprobs=np.ascontiguousarray(topk.logprobs, dtype=np.float32).tobytes(),
                           k=k, length=length)


def sample_response(sequences: list[Sequence], prompt_logprobs: list[float] | None,
                    prompt_topk: TopK | None = None) -> bytes:
    """A serialized `SampleResponse`; prompt logprobs are NaN where there is none (position 0)."""
    pb = _pb()
    msg = pb.SampleResponse()
    reasons = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
    for seq in sequences:
        out = msg.sequences.add(stop_reason=reasons[seq.stop_reason],
                                tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
                                logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes())
        if seq.topk is not None:
            out.topk_sampled_logprobs.CopyFrom(_topk_message(pb, seq.topk))
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    if prompt_topk is not None:
        msg.topk_prompt_logprobs.CopyFrom(_topk_message(pb, prompt_topk))
    return msg.SerializeToString()
