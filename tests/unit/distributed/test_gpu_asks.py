"""GPU asks of the Ray actors that could never be placed are refused before any actor starts: a fraction
above one GPU (Ray refuses it with a traceback) and, on a local cluster, more GPUs than the machine has
(the actors would wait forever)."""

from __future__ import annotations

import pytest

from rlhfkit.distributed import launch
from rlhfkit.distributed.launch import check_gpu_asks
from rlhfkit.errors import ConfigError


@pytest.mark.parametrize("trainer,worker,workers,trainers,gpus", [
    (0.5, 0.5, 1, 1, 1),  # halves share one GPU
    (1, 0.5, 2, 1, 2),  # the trainer whole, two workers on the other
    (0.0, 0.0, 4, 1, 0),  # CPU only
    (1, 2, 1, 1, 3),  # whole GPUs add up
    (0.3, 0.3, 2, 1, 1),  # 0.9 of one GPU
])
def test_asks_that_fit(trainer, worker, workers, trainers, gpus):
    check_gpu_asks([(trainers, trainer, "trainer actor(s)"), (workers, worker, "rollout worker(s)")], gpus)


@pytest.mark.parametrize("trainer,worker,workers,trainers,gpus,need", [
    (0.0, 1, 1, 1, 0, 1),  # a GPU per worker on a CPU machine
    (0.0, 0.6, 3, 1, 2, 3),  # 0.6 + 0.6 do not share a GPU: three GPUs, though they sum to 1.8
    (1, 2, 2, 1, 4, 5),
    (1, 0.0, 0, 2, 1, 2),  # two FSDP trainer actors
])
def test_asks_beyond_the_machine_are_refused(trainer, worker, workers, trainers, gpus, need):
    with pytest.raises(ConfigError, match=f"need {need} GPU\\(s\\), and this machine has {gpus}: Ray would wait"):
        check_gpu_asks([(trainers, trainer, "trainer actor(s)"), (workers, worker, "rollout worker(s)")], gpus)


def test_a_ray_run_asking_for_absent_gpus_stops_before_any_actor(monkeypatch, tmp_path, tiny_folder):
    import rlhfkit

    monkeypatch.setattr(launch, "start_ray", lambda *a, **k: False)
    monkeypatch.setattr(launch, "cluster_gpus", lambda address: 0)

    def no_actors(*a, **k):
        raise AssertionError("an actor was asked for")

    monkeypatch.setattr(launch, "run_in_trainer_actors", no_actors)
    cfg = rlhfkit.RLConfig.from_args([
        "--actor.model_name_or_path", str(tiny_folder), "--distributed.backend", "ray", "--rollout.num_workers", "2",
        "--distributed.num_gpus_per_worker", "1", "--ckpt.output_dir", str(tmp_path / "o")])
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=lambda **kw: [0.0], train_dataset=[{"input": "a"}] * 16)
    needle = r"and 2 rollout worker\(s\) \(--distributed.num_gpus_per_worker\) asking 1 GPU each need 2 GPU\(s\)"
    with pytest.raises(ConfigError, match=needle + ", and this machine has 0"):
        trainer.train()


def test_tools_environments_and_agents_given_as_objects_reach_the_ray_trainer_actor(monkeypatch, tmp_path,
                                                                                     tiny_folder):
    """Ray pickles the actor's arguments with cloudpickle: the objects arrive there as copies, and one that cannot
    be pickled is refused in one line before Ray starts."""
    import threading

    from ray import cloudpickle

    import rlhfkit

    monkeypatch.setattr(launch, "start_ray", lambda *a, **k: False)
    monkeypatch.setattr(launch, "cluster_gpus", lambda address: 0)
    got = {}

    def actor(fn, args, *rest, **kw):  # what Ray does with the arguments: a cloudpickle round trip
        got.update(cloudpickle.loads(cloudpickle.dumps(args))[2])
        return {}

    monkeypatch.setattr(launch, "run_in_trainer_actors", actor)
    cfg = rlhfkit.RLConfig.from_args(["--actor.model_name_or_path", str(tiny_folder), "--distributed.backend", "ray",
                                      "--ckpt.output_dir", str(tmp_path / "o")])

    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: the first.
            b: the second.
        """
        return a + b

    class Counter:
        def reset(self, **row):
            return "go"

    rlhfkit.RLTrainer.from_config(cfg, reward_fn=lambda **kw: [0.0], train_dataset=[{"input": "a"}] * 16,
                                  tools=[add], environment_factory=Counter).train()
    assert got["tools"][0](2, 3) == 5 and got["environment_factory"]().reset() == "go" and got["agent"] is None
    lock = threading.Lock()
    with pytest.raises(ConfigError, match=r"agent=lock cannot be sent to the trainer actor .*--agent.func_path FILE"):
        rlhfkit.RLTrainer.from_config(cfg, reward_fn=lambda **kw: [0.0], train_dataset=[{"input": "a"}] * 16,
                                      agent=lock)


def test_an_unsendable_closure_is_refused_by_name_before_ray_starts(monkeypatch, tmp_path, tiny_folder):
    """A tool or environment that closes over what cannot be pickled (a lock, a socket) is named in the one-line
    error (not its type, `list` or `type`), and a reward function given as a Python object is checked as
    well: it travels to the trainer actor the same way."""
    import threading

    import rlhfkit

    def no_ray(*a, **k):
        raise AssertionError("Ray started")

    monkeypatch.setattr(launch, "start_ray", no_ray)
    cfg = rlhfkit.RLConfig.from_args(["--actor.model_name_or_path", str(tiny_folder), "--distributed.backend", "ray",
                                      "--ckpt.output_dir", str(tmp_path / "o")])
    lock = threading.Lock()

    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: the first.
            b: the second.
        """
        return a + b

    def locked_add(a: int, b: int) -> int:
        """Add two numbers under the lock.

        Args:
            a: the first.
            b: the second.
        """
        with lock:
            return a + b

    class LockedCounter:
        guard = lock

    rows = [{"input": "a"}] * 16
    for kwargs, needle in [
            (dict(tools=[add, locked_add]), r"tools=.*locked_add cannot be sent .*_thread.lock.*--agent.tools FILE"),
            (dict(environment_factory=LockedCounter), r"environment_factory=.*LockedCounter cannot be sent"),
            (dict(reward_fn=lambda **kw: [float(lock.locked())]), r"reward_fn=.*<lambda> cannot be sent .*"
                                                                   r"--reward.remote_url FILE.py:NAME")]:
        with pytest.raises(ConfigError, match=needle) as err:
            rlhfkit.RLTrainer.from_config(cfg, **{"reward_fn": lambda **kw: [0.0], **kwargs}, train_dataset=rows)
        assert "\n" not in str(err.value)
