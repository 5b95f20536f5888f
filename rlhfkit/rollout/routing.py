"""What a generation engine records of a mixture-of-experts model's routing (routing replay): the
experts each MoE layer chose for each token, in the forward that first computed the token, as the codes
of core.moe ([tokens, layers, k]; missing_code for the tokens the engine did not run through the model).

A prefill runs a prompt's tokens in one forward (left-padded rows), or in two: the shared prefix of the
chunk's prompts on one row, then each prompt's own tokens (rollout.prefix); or only the tokens after a
kept turn's (rollout.turns), whose experts the earlier turn recorded and the executor keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlhfkit.core.moe import missing_code
from rlhfkit.models.moe import ExpertRecorder


def prompt_codes(prompts: Sequence[Sequence[int]], before: Sequence[int], calls: list,
                 missing: Callable[[tuple, torch.device], torch.Tensor]) -> list[torch.Tensor]:
    """Each prompt's codes [P, layers, k] from the prefill's recorded forwards `calls` (each [rows, T,
    layers, k] or None: not recorded): the prompt's last len(p) - before[i] tokens from row i of the last
    forward (left-padded), its first before[i] from the shared prefix's forward when there were two
    (its row 0), else `missing((n,), device)` (a kept turn's tokens)."""
    last = calls[-1] if calls else None
    prefix = calls[0][0] if len(calls) == 2 and calls[0] is not None else None
    device = last.device if last is not None else torch.device("cpu")
    out = []
    for i, (p, b) in enumerate(zip(prompts, before)):
        own = len(p) - b
        tail = missing((own,), device) if last is None else last[i, last.shape[1] - own:]
        head = prefix[:b] if prefix is not None else missing((b,), tail.device)
        out.append(torch.cat([head, tail]))
    return out


def missing_codes(shape: tuple, recorder: ExpertRecorder, device: torch.device) -> torch.Tensor:
    """Codes [*shape, layers, k] of tokens the engine did not compute, for `recorder`'s model."""
    layers, k = len(recorder.routers), recorder.top_k
    return torch.full((*shape, layers, k), missing_code(recorder.dtype), dtype=recorder.dtype, device=device)
