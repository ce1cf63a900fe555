"""The profiled step's timeline: host before the device, busy by kind, idle between kernels."""

from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from dysco_interp.analysis.step_timeline import STEP_LABEL, Span, kernel_kind, profiled_timeline, step_timeline


def test_the_wall_time_splits_into_host_busy_idle_and_after():
    step = Span(STEP_LABEL, 0.0, 1000.0)
    kernels = [Span("nvjet_sm90_tst_splitK_TNT", 100.0, 300.0), Span("cudnn_sdpa_flash_fprop", 250.0, 400.0),
               Span("triton_red_fused_rms_norm", 500.0, 520.0), Span("Memcpy DtoD", 900.0, 950.0),
               Span("outside the step", 1200.0, 1300.0)]
    t = step_timeline(step, kernels)
    assert t["wall_ms"] == 1.0
    assert t["host_before_ms"] == pytest.approx(0.1)
    assert t["device_busy_ms"] == pytest.approx(0.37)  # 100-400, 500-520, 900-950: overlaps once
    assert t["device_idle_between_ms"] == pytest.approx(0.48)  # 850 from first to last, less busy
    assert t["after_last_ms"] == pytest.approx(0.05)
    assert t["host_before_ms"] + t["device_busy_ms"] + t["device_idle_between_ms"] + t["after_last_ms"] == \
        pytest.approx(t["wall_ms"])
    assert t["busy_by_kind_ms"] == {"attention": 0.15, "copy": 0.05, "matmul": 0.2, "other": 0.02}
    assert t["device_spans"] == 4


def test_the_idle_time_splits_into_short_and_long_gaps_named_by_their_kernels():
    step = Span(STEP_LABEL, 0.0, 100.0)
    kernels = [Span("a", 0.0, 10.0), Span("b", 12.0, 20.0), Span("c", 15.0, 30.0),  # b and c overlap
               Span("d", 31.0, 40.0), Span("e", 60.0, 70.0), Span("f", 76.0, 80.0)]
    t = step_timeline(step, kernels)
    assert t["idle_in_short_gaps_ms"] == pytest.approx(0.003)  # 10-12, 30-31
    assert t["idle_in_long_gaps_ms"] == pytest.approx(0.026)  # 40-60, 70-76
    assert t["idle_in_short_gaps_ms"] + t["idle_in_long_gaps_ms"] == pytest.approx(t["device_idle_between_ms"])
    assert t["long_gaps"] == 2
    # longest first; the gap after the overlap is named by the span that ended last (c, not b)
    assert [(g["us"], g["after"], g["before"]) for g in t["longest_gaps"]] == [
        (20.0, "d", "e"), (6.0, "e", "f"), (2.0, "a", "b"), (1.0, "c", "d")]


def test_kernel_kinds():
    assert kernel_kind("void cublasLt::splitKreduce_kernel<32, 16>") == "matmul"
    assert kernel_kind("void cudnn::fusion::lean_reduction_kernel") == "attention"
    assert kernel_kind("triton_poi_fused_mul_silu_0") == "other"


def test_the_profiler_events_are_read_on_one_clock_and_the_step_annotation_is_no_work():
    def event(name, start, end, device):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_type=device)

    events = [event(STEP_LABEL, 0.0, 100.0, DeviceType.CPU), event(STEP_LABEL, 10.0, 90.0, DeviceType.CUDA),
              event("aten::copy_", 1.0, 5.0, DeviceType.CPU), event("gemv", 10.0, 90.0, DeviceType.CUDA)]
    t = profiled_timeline(events)
    assert t is not None and t["device_spans"] == 1 and t["host_before_ms"] == 0.01
    assert profiled_timeline(events[2:3]) is None  # no step range, no device: a CPU run


def test_a_cpu_profile_writes_the_operator_table_only(tmp_path):
    import torch

    from dysco_interp.analysis.bench import profile_step

    profile_step(lambda tok: tok * 2, torch.ones(3), str(tmp_path / "prof" / "8_vanilla.txt"))
    assert "aten::mul" in (tmp_path / "prof" / "8_vanilla.txt").read_text()
    assert not (tmp_path / "prof" / "8_vanilla.json").exists()
