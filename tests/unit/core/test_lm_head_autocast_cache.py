"""The fused LM head's backward does not clear autocast's cache of weight casts. On CUDA the backward
runs on autograd's device thread, outside the forward's autocast region: a `torch.autocast` block
there, on leaving, cleared the cache for every thread, so each micro-batch cast every weight again.
A backward run from another thread stands for the device thread on the CPU."""

import threading

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from rlhfkit.core.lm_head import linear_logprobs_and_entropy


class WeightCasts(TorchDispatchMode):
    """Counts the casts of a tensor of `shape` (autocast's casts reach the dispatcher as _to_copy)."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.count = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and tuple(args[0].shape) == self.shape:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _casts_of_next_linear(h, w) -> int:
    with WeightCasts(tuple(w.shape)) as casts:
        F.linear(h, w)
    return casts.count


@pytest.mark.parametrize("keep_bytes", [None, 0])  # softmax kept, or recomputed in the backward
def test_a_backward_on_another_thread_keeps_the_cached_weight_cast(keep_bytes):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(50, 16, generator=g).requires_grad_()
    h = torch.randn(7, 16, generator=g).requires_grad_()
    labels = torch.randint(0, 50, (7,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _casts_of_next_linear(h, w) == 1  # cast once, then cached
        assert _casts_of_next_linear(h, w) == 0
        logp, _ = linear_logprobs_and_entropy(h, w, labels, with_entropy=False, chunk_size=4, keep_bytes=keep_bytes)
        thread = threading.Thread(target=lambda: logp.sum().backward())
        thread.start()
        thread.join()
        assert _casts_of_next_linear(h, w) == 0  # still cached
    assert w.grad is not None and h.grad is not None


def test_the_backward_thread_computes_the_same_gradients_and_leaves_its_autocast_state():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(50, 16, generator=g).requires_grad_()
    h = torch.randn(7, 16, generator=g).requires_grad_()
    labels = torch.randint(0, 50, (7,), generator=g)
    grads, states = [], []
    for threaded in (False, True):
        w.grad = h.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp, _ = linear_logprobs_and_entropy(h, w, labels, with_entropy=False)

            def run(logp=logp):
                logp.sum().backward()
                states.append(torch.is_autocast_enabled("cpu"))

            if threaded:
                thread = threading.Thread(target=run)
                thread.start()
                thread.join()
            else:
                run()
        grads.append((w.grad.clone(), h.grad.clone()))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    assert states == [True, False]  # each thread's own autocast flag, restored
