"""Recorded engine calls of one episode -> trajectories to train on, from token ids alone.

Every call the agent made through the endpoint is recorded as a `Call`: the prompt token ids the
engine was given, the ids it sampled and their logprobs. `stitch` turns an episode's calls into
segments:

- a call whose prompt ids start with the whole of an earlier segment (its prompt, every sampled
  and in-between token so far), and whose images start with the segment's images (a
  vision-language policy: the same images in the same order, then any new ones), extends that segment: the tokens
  between the segment's end and the call's sampled tokens (the agent's feedback, tool results, the next generation
  prompt) join the response with loss_mask False (logprob 0), the sampled tokens with loss_mask True and the engine's
  logprobs. An agent that keeps its history gives ONE trajectory, as the built-in multi-turn loop.
- a call that extends no segment (the agent rewrote, dropped or summarised earlier turns, or made
  a second call from the same history) starts a new segment whose prompt is its whole prompt: it
  trains only the tokens that call sampled. `Stitched.splits` counts the extra segments.

A segment's images are its last call's (`Call.vision`, every image of that call's prompt, in
order); its trajectory carries them in `info["vision"]`, as a multi-turn episode's does, so the
trainer's forward sees them. All segments of an episode carry the same reward, so they get the same advantage (the group
baseline counts the episode once: `info["episode"]`). Nothing is re-tokenized from text. This is
the "prefix merge" of OpenRLHF's server executor, which asserts on a prefix break; here a break
becomes a new segment instead (as prime-rl and verifiers do when an environment rewrites history).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlhfkit.agents.executor import episode_trajectory
from rlhfkit.data.types import FINISH_LENGTH, Trajectory


@dataclass
class Call:
    """One sample the engine generated for an episode: prompt ids, sampled ids, their logprobs,
    the policy version that sampled them and why sampling stopped ("stop" or "length"); with a
    vision-language policy the keys of its prompt's images (`vision.ImageParts`) and their
    tensors (VisionInputs), None without images."""

    prompt_ids: list[int]
    sampled_ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: str
    images: tuple[str, ...] = ()
    vision: Any = None


@dataclass
class _Segment:
    """What `episode_trajectory` reads: prompt_ids, response, mask, logprobs, versions, truncated, group_id."""

    prompt_ids: list[int]
    group_id: int
    response: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    truncated: bool = False
    images: tuple[str, ...] = ()
    vision: Any = None

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response

    def extend(self, call: Call) -> None:
        gap = len(call.prompt_ids) - len(self.ids)
        version = self.versions[-1] if self.versions else call.version
        self.response += call.prompt_ids[len(self.ids):] + call.sampled_ids
        self.mask += [False] * gap + [True] * len(call.sampled_ids)
        self.logprobs += [0.0] * gap + list(call.logprobs)
        self.versions += [version] * gap + [call.version] * len(call.sampled_ids)
        self.truncated = call.finish_reason == FINISH_LENGTH
        self.images, self.vision = call.images, call.vision


@dataclass
class Stitched:
    """The segments of one episode, in the order their first calls were made."""

    trajectories: list[Trajectory]
    splits: int  # segments beyond the first


def _extends(call: Call, seg: _Segment) -> bool:
    ids, prefix, images = call.prompt_ids, seg.ids, seg.images
    return (len(ids) >= len(prefix) and list(ids[: len(prefix)]) == list(prefix)
            and tuple(call.images[: len(images)]) == tuple(images))


def _info(seg: _Segment, info: dict) -> dict:
    out = dict(info)
    if seg.vision is not None:
        out["vision"] = seg.vision  # the trainer's forward takes the segment's images from here
    return out


def stitch(calls: Sequence[Call], group_id: int, version: int, info: dict) -> Stitched:
    """Segments of `calls` (in the order they finished); each trajectory gets a copy of `info`.

    A call extends the longest segment whose token ids (and images) its prompt starts with (and which no later
    call has already extended past that point); otherwise it starts a segment. `version`: the
    engine's, stamped on an episode that sampled no token."""
    segments: list[_Segment] = []
    for call in calls:
        best = None
        for seg in segments:
            if _extends(call, seg) and (best is None or len(seg.ids) > len(best.ids)):
                best = seg
        if best is None:
            best = _Segment(list(call.prompt_ids), group_id)
            segments.append(best)
        best.extend(call)
    trajectories = [episode_trajectory(s, version, _info(s, info)) for s in segments]
    return Stitched(trajectories, max(len(segments) - 1, 0))
