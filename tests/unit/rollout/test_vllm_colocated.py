"""VLLMEngine's weight paths and sleep/wake order, on a fake `vllm.LLM` whose one worker is the
real `WeightSyncExtension` over a fake model (no vllm, no GPU): which path is chosen from where
the tensors are, that the in-process path hands over the same tensor objects, that the bytes and
bucket paths deliver every tensor bit for bit, bucket sizes, and the order of sleep / wake /
update / generate calls in an RL step. The CUDA IPC handle itself (`share_cuda_tensor`,
`open_cuda_tensor`) needs a GPU: here it is replaced by a registry of CPU buffers."""

import inspect
import logging
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from rlhfkit.errors import ConfigError
from rlhfkit.rollout import vllm as V
from rlhfkit.rollout import vllm_worker as W
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.trainers.rl.sync import sync_weights

CUDA0 = torch.device("cuda", 0)
HERE = {"pid": 100, "host": "node", "device": "cuda:0", "uuid": "GPU-a"}


def make_state():
    return {
        "embed.weight": torch.randn(7, 5),
        "layer.0.weight": torch.randn(5, 5).to(torch.bfloat16),
        "layer.0.bias": torch.randn(5).to(torch.float16),
        "counter": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "mask": torch.tensor([True, False, True]),
        "scale": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }


class FakeModel:
    """Parameters named like the state; `load_weights` records what it was handed and copies it."""

    def __init__(self, state):
        self.params = {k: torch.zeros_like(v) for k, v in state.items()}
        self.handed: list[list[tuple[str, torch.Tensor]]] = []

    def parameters(self):
        return iter(self.params.values())

    def load_weights(self, weights):
        got = list(weights)
        self.handed.append(got)
        for name, t in got:
            self.params[name].copy_(t)


class FakeWorker(W.WeightSyncExtension):
    def __init__(self, model):
        self.model_runner = SimpleNamespace(model=model)


class FakeLLM:
    """Records every call in order; `collective_rpc` runs the method on the one worker."""

    def __init__(self, model, worker_info=None):
        self.worker, self.worker_info, self.calls = FakeWorker(model), worker_info, []

    def collective_rpc(self, method, args=()):
        self.calls.append(("rpc", method))
        if method == "rlhfkit_worker_info" and self.worker_info is not None:
            return [self.worker_info]
        return [getattr(self.worker, method)(*args)]

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", *tags))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, requests, sampling_params, use_tqdm):
        self.calls.append(("generate", len(requests)))
        out = SimpleNamespace(token_ids=[5], logprobs=[{5: -0.5}], finish_reason="length")
        return [SimpleNamespace(outputs=[out]) for _ in requests]


def engine_on(state, **kw):
    model = FakeModel(state)
    return V.VLLMEngine("/m", [2], llm=FakeLLM(model), state_fn=lambda: state, **kw), model


@pytest.fixture
def fake_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **kw: kw))


def assert_same_values(model, state):
    for k, v in state.items():
        got = model.params[k]
        assert got.dtype == v.dtype and got.shape == v.shape and torch.equal(got, v), k


# ------------------------------------------------------------------ choosing the path
def test_the_path_follows_where_the_tensors_and_the_workers_are():
    other = dict(HERE, pid=200)
    assert V.choose_weight_path(torch.device("cpu"), HERE, [other])[0] == "bytes"
    assert V.choose_weight_path(None, HERE, [HERE])[0] == "bytes"  # tensors on several devices
    assert V.choose_weight_path(CUDA0, HERE, [HERE]) == (
        "tensors", "vLLM's worker runs in this process; the policy's tensors on cuda:0 are handed over")
    assert V.choose_weight_path(CUDA0, HERE, [other]) == (
        "ipc", "vLLM's worker is another process on the policy's GPU (cuda:0)")
    assert V.choose_weight_path(CUDA0, HERE, [other, dict(other, uuid="GPU-b")])[0] == "bytes"  # TP on 2 GPUs
    assert V.choose_weight_path(CUDA0, HERE, [dict(other, host="elsewhere")])[0] == "bytes"
    assert V.choose_weight_path(CUDA0, HERE, [])[0] == "bytes"


def test_state_device_is_none_for_a_state_on_several_devices():
    assert V.state_device({"a": torch.zeros(1), "b": torch.zeros(2)}) == torch.device("cpu")
    assert V.state_device({"a": torch.zeros(1), "b": torch.zeros(1, device="meta")}) is None


def test_cpu_tensors_go_as_bytes_without_asking_the_workers_and_the_choice_is_logged_once(caplog):
    state = make_state()
    engine, model = engine_on(state)
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        engine.update_weights({}, 1)
        engine.update_weights({}, 2)
    assert [c for c in engine.llm.calls if c[0] == "rpc"] == [("rpc", "rlhfkit_load_weights")] * 2
    lines = [r.getMessage() for r in caplog.records if "weight sync" in r.getMessage()]
    assert lines == ["vLLM weight sync: raw bytes through CPU memory (the policy's tensors are on cpu)"]
    assert engine.weight_path == "bytes" and engine.version == 2


def test_the_worker_reports_its_process_and_device():
    info = FakeWorker(FakeModel({"w": torch.zeros(1)})).rlhfkit_worker_info()
    assert info["pid"] == os.getpid() and info["device"] == "cpu" and info["uuid"] is None


# ------------------------------------------------------------------ the three paths
def test_bytes_path_delivers_every_tensor_bit_for_bit():
    state = make_state()
    engine, model = engine_on(state)
    engine.update_weights(state, version=3)
    assert_same_values(model, state)
    assert engine.version == 3 and engine.llm.calls[-1] == ("reset_prefix_cache",)


def test_in_process_path_hands_over_the_same_tensor_objects(monkeypatch):
    monkeypatch.setattr(V, "choose_weight_path", lambda device, here, workers: ("tensors", "test"))
    state = make_state()
    engine, model = engine_on(state)
    engine.update_weights({}, 1)
    assert [c for c in engine.llm.calls if c[0] == "rpc"] == [("rpc", "rlhfkit_load_tensors")]
    (handed,) = model.handed
    assert [name for name, _ in handed] == list(state)
    assert all(t is state[name] for name, t in handed)  # no copy on the way
    assert_same_values(model, state)


class SharedBuffers:
    """Stands in for CUDA IPC: a handle is a key into a dict of the trainer's bucket buffers."""

    def __init__(self, calls):
        self.buffers, self.sizes, self.calls = {}, [], calls

    def share(self, buf):
        key = f"h{len(self.sizes)}".encode()
        self.buffers[key] = buf
        self.sizes.append(buf.numel())
        return key

    def open(self, handle, device_index):
        assert device_index == 0  # a CPU tensor's device index: None -> 0
        return self.buffers[handle]

    def release(self):
        self.calls.append(("release",))
        self.buffers.clear()  # the trainer's buffer of the bucket just loaded is gone


def test_ipc_path_sends_bounded_buckets_and_frees_each_before_the_next(monkeypatch):
    monkeypatch.setattr(V, "choose_weight_path", lambda device, here, workers: ("ipc", "test"))
    state = {"a": torch.randn(20), "b": torch.randn(30), "big": torch.randn(100),
             "c": torch.randn(10).to(torch.bfloat16), "d": torch.arange(3)}
    engine, model = engine_on(state, bucket_bytes=256)
    shared = SharedBuffers(engine.llm.calls)
    monkeypatch.setattr(V, "share_cuda_tensor", shared.share)
    monkeypatch.setattr(V, "release_cuda_shares", shared.release)
    monkeypatch.setattr(W, "open_cuda_tensor", shared.open)
    engine.update_weights({}, 1)
    # a 80 B at 0; b 120 B would end at 256 + 120 > 256: a bucket of its own; big 400 B > 256 alone;
    # c 20 B at 0 and d 24 B at 256 -> 280 > 256: apart
    assert shared.sizes == [80, 120, 400, 20, 24]
    assert [[n for n, _ in h] for h in model.handed] == [["a"], ["b"], ["big"], ["c"], ["d"]]
    assert engine.llm.calls == [("rpc", "rlhfkit_load_ipc"), ("release",)] * 5 + [("reset_prefix_cache",)]
    assert_same_values(model, state)


def test_buckets_pack_small_tensors_together_at_aligned_offsets():
    state = {"a": torch.randn(25), "b": torch.randn(25).to(torch.bfloat16), "c": torch.randn(4, 3).t(),
             "s": torch.tensor(1.5), "e": torch.zeros(0, 2), "m": torch.tensor([True, False])}
    sizes = [(k, W.tensor_nbytes(v)) for k, v in state.items()]
    assert sizes == [("a", 100), ("b", 50), ("c", 48), ("s", 4), ("e", 0), ("m", 2)]
    plan = W.plan_buckets(sizes, bucket_bytes=2048)
    assert plan == [[("a", 0), ("b", 256), ("c", 512), ("s", 768), ("e", 1024), ("m", 1024)]]
    assert W.plan_buckets(sizes, bucket_bytes=400) == [[("a", 0), ("b", 256)], [("c", 0), ("s", 256)],
                                                       [("e", 0), ("m", 0)]]
    buf, metas = W.fill_bucket(state, plan[0])
    assert buf.numel() == 1026 and buf.dtype == torch.uint8
    back = dict(W.bucket_views(buf, metas))
    for k, v in state.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k
    assert back["b"].untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()  # views, not copies
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        W.plan_buckets(sizes, 0)


def test_the_ipc_handle_is_plain_values_in_the_order_torch_rebuilds_them():
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    # share_cuda_tensor keeps the arguments after storage_device; open_cuda_tensor puts back the
    # classes, dtype and this process's device index before them
    assert list(inspect.signature(rebuild_cuda_tensor).parameters) == [
        "tensor_cls", "tensor_size", "tensor_stride", "tensor_offset", "storage_cls", "dtype", "storage_device",
        "storage_handle", "storage_size_bytes", "storage_offset_bytes", "requires_grad", "ref_counter_handle",
        "ref_counter_offset", "event_handle", "event_sync_required"]
    assert W._STORAGE_DEVICE_ARG == 6
    assert type(torch.empty(2, dtype=torch.uint8)._typed_storage()) is torch.storage.TypedStorage
    with pytest.raises(ValueError, match="1-d uint8 CUDA tensor"):
        W.share_cuda_tensor(torch.empty(4, dtype=torch.uint8))  # a CPU buffer never gets an IPC handle


# ------------------------------------------------------------------ sleep / wake around an RL step
def test_a_colocated_rl_step_wakes_weights_to_load_them_then_the_kv_cache_to_generate(fake_vllm):
    state = make_state()
    engine, model = engine_on(state, enable_sleep=True, auto_sleep=True)
    params = SamplingParams(max_new_tokens=1, n=2)
    engine.generate([[1, 2]], params)  # rollout: generate, then free the GPU for training
    sync_weights(engine)  # after the update
    trajs = engine.generate([[1, 2]], params)
    assert engine.llm.calls == [
        ("generate", 2), ("sleep", 1),
        ("wake_up", "weights"), ("rpc", "rlhfkit_load_weights"), ("reset_prefix_cache",),
        ("wake_up", "kv_cache"), ("generate", 2), ("sleep", 1),
    ]
    assert [t.version for t in trajs] == [1, 1]
    assert_same_values(model, state)


def test_sleep_and_wake_track_each_tag(fake_vllm):
    engine, _ = engine_on({"w": torch.ones(2)}, enable_sleep=True)
    engine.sleep()
    engine.sleep()  # already asleep: nothing
    engine.wake_up(("weights",))
    engine.sleep()  # weights awake, KV cache asleep: vLLM sleeps from fully awake
    engine.wake_up()
    engine.wake_up()  # awake: nothing
    assert engine.llm.calls == [("sleep", 1), ("wake_up", "weights"), ("wake_up", "kv_cache"), ("sleep", 1),
                                ("wake_up", "weights"), ("wake_up", "kv_cache")]


def test_without_sleep_mode_an_update_wakes_nothing_and_sleep_is_refused():
    engine, _ = engine_on({"w": torch.ones(2)})
    engine.update_weights({}, 1)
    assert not [c for c in engine.llm.calls if c[0] in ("sleep", "wake_up")]
    with pytest.raises(ConfigError, match="enable_sleep"):
        engine.sleep()
    with pytest.raises(ConfigError, match="auto_sleep needs enable_sleep"):
        engine_on({"w": torch.ones(2)}, auto_sleep=True)
    with pytest.raises(ConfigError, match="bucket_bytes must be > 0"):
        engine_on({"w": torch.ones(2)}, bucket_bytes=0)
