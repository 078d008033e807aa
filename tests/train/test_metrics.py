"""ProgressBar: plain lines every N steps / S seconds when the stream is not a terminal;
MetricsWriter: scalars to metrics.jsonl and TensorBoard, histograms to TensorBoard only."""

import io
import os

import numpy as np
import pytest

from jaxrl_vr.diagnostics import Histogram
from jaxrl_vr.train.metrics import MetricsWriter, ProgressBar, _duration, read_jsonl


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def _run(bar: ProgressBar, clock: FakeClock, steps: int, dt: float) -> None:
    for _ in range(steps):
        clock.now += dt
        bar.update({"reward": 0.5, "kl": 0.01, "generated_tokens": 200.0})


def test_non_tty_prints_a_plain_line_every_n_steps_and_the_last():
    stream, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(25, file=stream, every_steps=10, every_s=1e9, clock=clock)
    _run(bar, clock, 25, dt=2.0)
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert [line.split(" ")[2] for line in lines] == ["10/25", "20/25", "25/25"]
    # 2 s per step: 0.5 step/s; after 10 steps 15 remain -> 30 s; tokens 200 per 2 s.
    assert lines[0] == ("rl step 10/25 (40%) | 0.5 step/s | ETA 30s | elapsed 20s | "
                        "reward 0.500 kl 0.010 tok/s 100")
    assert "ETA 0s" in lines[-1] and "(100%)" in lines[-1]


def test_non_tty_prints_every_s_seconds_when_steps_are_slow():
    stream, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(1000, initial=500, file=stream, every_steps=100, every_s=30.0, clock=clock)
    _run(bar, clock, 4, dt=20.0)  # printed at 40 s (step 502) and 80 s (step 504)
    lines = stream.getvalue().splitlines()
    assert [line.split(" ")[2] for line in lines] == ["502/1000", "504/1000"]
    assert "0.05 step/s" in lines[0] and "ETA 2h46m00s" in lines[0]  # 498 steps x 20 s = 9960 s
    bar.close()
    assert len(stream.getvalue().splitlines()) == 2  # step 504 already printed


def test_a_token_budget_sets_the_total_to_the_step_it_runs_out_and_the_eta_with_it():
    stream, clock = io.StringIO(), FakeClock()
    # 5000 steps configured, a 10,000-token budget of which a calibration charged 1,000; 300 per step.
    bar = ProgressBar(5000, file=stream, every_steps=5, every_s=1e9, clock=clock, budget_tokens=10_000,
                      budget_initial=1_000)
    charged = 1_000.0
    for _ in range(30):
        clock.now += 2.0
        charged += 300.0
        bar.update({"reward": 0.5, "generated_tokens": 300.0}, charged=charged)
        if charged >= 10_000:
            break
    bar.close()
    lines = stream.getvalue().splitlines()
    # After 5 steps 2,500 tokens are charged: 7,500 more at 300 per step is 25 steps, 30 in all.
    assert lines[0] == "rl step 5/~30 (17%) | 0.5 step/s | ETA 50s | elapsed 10s | budget 25% reward 0.500 tok/s 150"
    assert lines[-1].startswith("rl step 30/~30 (100%)") and "ETA 0s" in lines[-1] and "budget 100%" in lines[-1]


def test_without_a_budget_the_total_is_the_configured_steps():
    stream, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(10, file=stream, every_steps=10, clock=clock)
    for _ in range(10):
        clock.now += 1.0
        bar.update({"reward": 0.5}, charged=123.0)  # ignored: no budget
    assert stream.getvalue().startswith("rl step 10/10 (100%)")


def test_close_prints_the_last_step_of_an_interrupted_run():
    stream, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(100, file=stream, every_steps=10, clock=clock)
    _run(bar, clock, 13, dt=1.0)
    bar.close()
    bar.close()  # twice: once
    assert [line.split(" ")[2] for line in stream.getvalue().splitlines()] == ["10/100", "13/100"]


def test_tty_keeps_tqdm_and_disable_prints_nothing():
    tty, clock = FakeTTY(), FakeClock()
    bar = ProgressBar(5, file=tty, clock=clock)
    _run(bar, clock, 5, dt=1.0)
    bar.close()
    assert "\r" in tty.getvalue() and "5/5" in tty.getvalue()
    quiet = io.StringIO()
    bar = ProgressBar(5, file=quiet, disable=True, clock=clock)
    _run(bar, clock, 5, dt=1.0)
    bar.close()
    assert quiet.getvalue() == ""
    forced = io.StringIO()
    bar = ProgressBar(2, file=forced, tty=False, clock=clock)
    _run(bar, clock, 2, dt=1.0)
    assert forced.getvalue().startswith("rl step 2/2")


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (59.4, "59s"), (60, "1m00s"), (3723, "1h02m03s"),
                                           (float("inf"), "?")])
def test_duration(seconds, text):
    assert _duration(seconds) == text


def test_bad_intervals_are_rejected():
    with pytest.raises(ValueError, match="every_steps"):
        ProgressBar(5, every_steps=0, file=io.StringIO())


def test_evaluation_progress_in_a_log_file_is_plain_lines_of_chunks():
    """experiments.evaluate's progress without a terminal: no carriage-return frames."""
    stream, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(3, desc="final", unit="chunk", file=stream, every_steps=1, clock=clock)
    for _ in range(3):
        clock.now += 2.0
        bar.update({})
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text and text.splitlines()[-1].startswith("final chunk 3/3 (100%) | 0.5 chunk/s")
    assert "tok/s" not in text


def _tensorboard_events(directory):
    """(tag, kind) of every summary value in the TFRecord event files under ``directory``."""
    import struct

    from tensorboardX.proto import event_pb2

    found = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                found.append((value.tag, value.WhichOneof("value")))
    return found


def test_histograms_go_to_tensorboard_and_not_to_metrics_jsonl(tmp_path):
    writer = MetricsWriter(str(tmp_path), tensorboard=True)
    scalars = writer.write(1, {"one_positive_frac": 0.25, "prompt_dist/observed": Histogram(np.array([0.0, 0.5, 1.0]))})
    writer.close()
    assert scalars == {"one_positive_frac": 0.25}
    assert read_jsonl(str(tmp_path / "metrics.jsonl")) == [{"step": 1, "one_positive_frac": 0.25}]
    events = _tensorboard_events(str(tmp_path / "tb"))
    assert ("one_positive_frac", "simple_value") in events and ("prompt_dist/observed", "histo") in events
