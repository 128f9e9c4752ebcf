"""The one measured step and what the bench builds on it: the step-time breakdown, parity in the
report's own types, and the checks made before anything is measured."""

import os

import pytest
import torch

from heptstudy.errors import HeptstudyError
from heptstudy.measure import bench
from heptstudy.measure import report as rp
from heptstudy.measure.summary import describe, step_breakdown_frame
from heptstudy.meters.timing import STEP_PHASES, WallPhaseClock
from heptstudy.model import example_batch
from heptstudy.train.optim import build_optimizer, build_scheduler
from heptstudy.train.step import run_step
from tests.conftest import generate_tiny_data, tiny_request


@pytest.fixture(scope="module")
def bench_report(tiny_data_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "baseline_b2.json"
    bench.run_bench(tiny_request(tiny_data_dir, path, batch_size=2, steps=2, warmup=1).resolve())
    return rp.read_report(path)


def test_every_step_has_its_phase_times(bench_report):
    assert bench_report.status == "ok" and len(bench_report.steps) == 3
    for step in bench_report.steps:
        phases = step.phase_time_s
        assert list(phases) == list(STEP_PHASES)
        assert all(t > 0 for t in phases.values())
        # the phases lie inside the timed step and cover it but for the clock's own calls
        assert 0.8 * step.time_s <= sum(phases.values()) <= step.time_s
    s = bench_report.summary
    counted = [st.phase_time_s for st in bench_report.steps if st.counted]
    for phase in STEP_PHASES:
        expected = sum(c[phase] for c in counted) / len(counted)
        assert s.mean_phase_time_s[phase] == pytest.approx(expected, rel=1e-12)
    assert "wall clock" in s.phase_time_definition
    assert "backbone forward" in describe(bench_report)


def test_breakdown_table_and_figure(bench_report, tmp_path):
    from heptstudy import plots

    old = rp.validate_report(bench_report.model_dump())
    old.summary.mean_phase_time_s = None  # a report from before the breakdown: not a row
    frame = step_breakdown_frame([(tmp_path / "a.json", bench_report), old])
    assert frame["name"].tolist() == ["baseline_b2"]
    assert (
        frame.loc[0, "backbone forward"]
        == bench_report.summary.mean_phase_time_s["backbone_forward"]
    )
    fig = plots.step_breakdown_figure(frame, tag="synthetic data")
    assert len(fig.axes[0].patches) == len(STEP_PHASES)  # one bar, one segment per phase


def test_phase_clock_changes_nothing(tiny_config):
    """The same step with and without the clock: the same losses and the same updated weights."""
    batch = example_batch(tiny_config, 2, [40, 70], seed=1)
    results = []
    for clock in (None, WallPhaseClock()):
        torch.manual_seed(0)
        from heptstudy.model import build_model

        model = build_model(tiny_config)
        optimizer = build_optimizer(model, tiny_config.train)
        scheduler = build_scheduler(optimizer, tiny_config.train)
        torch.manual_seed(1)
        out = run_step(model, batch, optimizer, scheduler, tiny_config, None, clock=clock)
        results.append((out.losses, [p.detach().clone() for p in model.parameters()]))
    (l0, w0), (l1, w1) = results
    assert all(torch.equal(l0[k], l1[k]) for k in l0)
    assert all(torch.equal(a, b) for a, b in zip(w0, w1, strict=True))


def test_gradient_accumulation_is_the_mean_of_the_micro_batches(tiny_config):
    """Two micro-batches in one step: the gradients and losses of the two batches' mean, as if
    each had been stepped alone (no update between them)."""
    from heptstudy.model import build_model

    cfg = tiny_config.model_copy(deep=True)
    cfg.model.heptv2.dropout = cfg.model.decoder.dropout = 0.0
    first, second = (example_batch(cfg, 2, [40, 70], seed=s) for s in (1, 2))
    torch.manual_seed(0)
    model = build_model(cfg)
    alone = [run_step(model, b, None, None, cfg, None).losses for b in (first, second)]
    summed = [p.grad.clone() for p in model.parameters()]  # no optimizer: they add up
    model.zero_grad(set_to_none=True)
    both = run_step(model, [first, second], None, None, cfg, None)
    for p, g in zip(model.parameters(), summed, strict=True):
        torch.testing.assert_close(p.grad, g / 2, rtol=1e-5, atol=1e-7)
    for k, v in both.losses.items():
        torch.testing.assert_close(v, (alone[0][k] + alone[1][k]) / 2)


def test_memory_timeline_marks_every_phase_before_the_update(tiny_config):
    from heptstudy import study

    batch = example_batch(tiny_config, 1, 60, seed=2)
    mem = study.step_memory_timeline(tiny_config, batch)
    labels = [label for _, label in mem.marks]
    assert labels == ["backbone_forward", "decoder_and_heads", "loss", "backward"]
    ops = [op for op, _ in mem.marks]
    assert ops == sorted(ops) and mem.peak_allocated_bytes > 0


def test_parity_returns_the_report_types(tiny_config):
    from heptstudy.measure.parity import run_parity

    batch = example_batch(tiny_config, 1, 50, seed=3)
    parity = run_parity(tiny_config, batch, torch.device("cpu"), trajectory_steps=2)
    assert isinstance(parity, rp.Parity)
    c = parity.checkpointed_vs_baseline
    logits = next(o for o in c.outputs if o.name == "class_logits")
    assert logits.shape == [1, tiny_config.model.decoder.num_queries, 6]
    assert c.loss.name == "loss_total" and c.loss.equal  # exact parity on CPU
    assert "total" in {t.name for t in c.loss_components} and c.overall_rel_l2 == 0.0
    assert parity.repeat_vs_baseline.num_gradients == c.num_gradients > 0
    assert [len(v) for v in parity.loss_trajectories.values()] == [2, 2]


# ----------------------------------------------------------- refused before anything is measured


@pytest.fixture
def nothing_measured(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a step ran although the run should have been refused first")

    monkeypatch.setattr(bench, "run_step", refuse)
    monkeypatch.setattr(bench, "run_parity", refuse)


def test_output_under_a_file_is_refused_first(tiny_data_dir, tmp_path, nothing_measured):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(
        bench.OutputNotWritable, match="is a file, not a folder; nothing was measured"
    ):
        bench.run_bench(tiny_request(tiny_data_dir, blocker / "r.json", batch_size=1).resolve())
    with pytest.raises(bench.OutputNotWritable, match="is a directory"):
        bench.run_bench(tiny_request(tiny_data_dir, tmp_path, batch_size=1).resolve())
    assert blocker.read_text() == "x" and sorted(os.listdir(tmp_path)) == ["file.txt"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_unwritable_output_folder_is_refused_first(tiny_data_dir, nothing_measured):
    # even root cannot make a folder in /proc: the case a chmod-ed folder is for other users
    with pytest.raises(
        bench.OutputNotWritable, match="cannot write the report.*nothing was measured"
    ):
        bench.run_bench(
            tiny_request(tiny_data_dir, "/proc/self/heptstudy/r.json", batch_size=1).resolve()
        )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_folder_is_refused_first(tiny_data_dir, tmp_path, nothing_measured):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(bench.OutputNotWritable, match="Permission denied"):
            bench.run_bench(tiny_request(tiny_data_dir, folder / "r.json", batch_size=1).resolve())
    finally:
        folder.chmod(0o700)


@pytest.fixture(scope="module")
def four_events(tmp_path_factory):
    return generate_tiny_data(tmp_path_factory.mktemp("four"), 4, 4, seed=3)


@pytest.mark.parametrize(
    "values,words",
    [
        ({"batch_size": 8}, "batch_size=8 x 1 warm-up + 2 counted steps needs 24 events"),
        ({"batch_size": 2}, "needs 6 events"),  # no event twice, across steps either
        ({"kind": "parity", "batch_size": 8}, "batch_size=8 x one batch needs 8 events"),
    ],
)
def test_more_events_than_the_split_holds_is_refused(
    four_events, tmp_path, nothing_measured, values, words
):
    out = tmp_path / "r.json"
    with pytest.raises(HeptstudyError) as err:
        bench.run_bench(tiny_request(four_events, out, platform="local_cpu", **values).resolve())
    assert words in str(err.value) and "holds 4" in str(err.value)
    assert not out.exists()


def test_describe_reports_without_times_or_measurement(bench_report):
    timing_less = rp.validate_report(bench_report.model_dump())
    timing_less.summary.mean_step_time_s = None
    timing_less.summary.mean_phase_time_s = None
    assert "mean step not timed over 2 counted steps" in describe(timing_less)
    failed = rp.validate_report(
        {**bench_report.model_dump(), "status": "error", "error": "kernel died", "summary": None}
    )
    assert describe(failed).endswith("no measurement: kernel died")


def test_a_batch_16_report_records_batch_16_where_training_would(tiny_data_dir, tmp_path):
    path = tmp_path / "b16.json"
    m = tiny_request(
        tiny_data_dir, path, batch_size=16, checkpointing="every2", steps=1, warmup=0
    ).resolve()
    bench.run_bench(m.request.model_copy(update={"passes": "memory"}).resolve())
    data = rp.read_report(path)
    assert data.name == "checkpointed_every2_b16" and data.checkpointing.plan == "every2"
    assert data.batch_size == data.config["train"]["global_batch_size"] == 16
    assert data.config["model"]["heptv2"]["activation_checkpointing"] == "every2"
    assert all(len(s.event_indices) == 16 for s in data.steps)
