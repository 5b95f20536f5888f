from rlhfkit.tracking.metrics import drop_steps_after


def test_keeps_steps_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a": 3}\n{"step": 4, "a"')
    assert drop_steps_after(p, 2) == 2
    assert p.read_text() == '{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n'
    assert drop_steps_after(p, 5) == 0 and drop_steps_after(tmp_path / "none.jsonl", 0) == 0
