import torch

from rlhfkit.core import ema_update


def test_ema_one_step_by_hand():
    ema = [torch.tensor([1.0, 2.0]), torch.tensor([[0.0]])]
    params = [torch.tensor([3.0, 4.0], requires_grad=True), torch.tensor([[10.0]])]
    ema_update(ema, params, beta=0.9)
    torch.testing.assert_close(ema[0], torch.tensor([1.2, 2.2]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ema[1], torch.tensor([[1.0]]), atol=1e-6, rtol=0)
    assert not ema[0].requires_grad
