"""host_cpu: bf16 dot units from /proc/cpuinfo text; bf16 compute on a CPU without them warns."""

import dataclasses
import warnings

import pytest
from flax import nnx

from jaxrl_vr import host_cpu
from jaxrl_vr.models import Decoder, DecoderConfig, set_compute_dtype

# Trimmed /proc/cpuinfo texts of the CPUs this project has measured on (docs/performance.md).
EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx fma avx2 bmi2
"""
XEON_AMX = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: fpu sse avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""
ZEN4_AVX512_BF16 = """model name\t: AMD EPYC 9B14
flags\t\t: avx2 avx512f avx512_bf16 avx512_vnni
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm sve
"""
GRAVITON2 = """processor\t: 0
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp
"""


@pytest.mark.parametrize("cpuinfo, expected", [
    (EPYC_AVX2, False), (XEON_AMX, True), (ZEN4_AVX512_BF16, True),
    (GRAVITON3, True), (GRAVITON2, False), ("", None), ("processor\t: 0\n", None),
])
def test_bf16_dot_units(cpuinfo, expected):
    assert host_cpu.bf16_dot_units(cpuinfo) is expected


def test_a_flag_that_merely_contains_bf16_is_not_a_unit():
    assert host_cpu.bf16_dot_units("flags\t: avx2 avx512_bf16x notamx_bf16\n") is False


def test_advice_only_for_bf16_on_a_cpu_backend_without_units():
    advice = host_cpu.mixed_precision_advice("bfloat16", backend="cpu", cpuinfo=EPYC_AVX2)
    assert "AMD EPYC" in advice and "float32" in advice and "model.compute_dtype" in advice
    assert host_cpu.mixed_precision_advice("bfloat16", backend="cpu", cpuinfo=XEON_AMX) is None
    assert host_cpu.mixed_precision_advice("bfloat16", backend="gpu", cpuinfo=EPYC_AVX2) is None
    assert host_cpu.mixed_precision_advice("bfloat16", backend="cpu", cpuinfo="") is None
    for compute_dtype in ("float32", "", None):
        assert host_cpu.mixed_precision_advice(compute_dtype, backend="cpu", cpuinfo=EPYC_AVX2) is None


def test_cpuinfo_field_reads_the_first_cpus_line():
    text = "processor\t: 0\nmodel name\t: AMD EPYC 9B45\nflags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel name\t: other\n"
    assert host_cpu.cpuinfo_field(text, "model name") == "AMD EPYC 9B45"
    assert host_cpu.cpuinfo_field(text, "flags") == "fpu avx2"
    assert host_cpu.cpuinfo_field(text, "Features") is None and host_cpu.cpuinfo_field("", "flags") is None


def test_read_cpuinfo_of_a_missing_file_is_empty(tmp_path):
    assert host_cpu.read_cpuinfo(str(tmp_path / "no-such-file")) == ""


@pytest.mark.parametrize("cpuinfo, warns", [(EPYC_AVX2, True), (XEON_AMX, False)])
def test_set_compute_dtype_warns_where_bf16_is_slower(monkeypatch, cpuinfo, warns):
    monkeypatch.setattr(host_cpu, "read_cpuinfo", lambda: cpuinfo)
    model = Decoder(DecoderConfig.tiny(), rngs=nnx.Rngs(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        set_compute_dtype(model, "bfloat16")
        set_compute_dtype(model, "float32")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == int(warns)
    assert model.config.compute_dtype == "float32"  # the warning changes nothing


@pytest.mark.parametrize("cpuinfo, backend, hidden, param_dtype, expected", [
    (XEON_AMX, "cpu", 576, "float32", "bfloat16"),
    (ZEN4_AVX512_BF16, "cpu", 896, "float32", "bfloat16"),
    (GRAVITON3, "cpu", 576, "float32", "bfloat16"),
    (EPYC_AVX2, "cpu", 576, "float32", "float32"),
    (GRAVITON2, "cpu", 576, "float32", "float32"),
    ("", "cpu", 576, "float32", "float32"),  # unknown CPU: float32
    (EPYC_AVX2, "gpu", 576, "float32", "bfloat16"),
    (EPYC_AVX2, "tpu", 576, "float32", "bfloat16"),
    (XEON_AMX, "cpu", 96, "float32", "float32"),  # the embedded default's width stays float32
    (XEON_AMX, "gpu", 96, "float32", "float32"),
    (EPYC_AVX2, "cpu", 576, "bfloat16", "bfloat16"),  # bf16 parameters compute in bf16
])
def test_auto_compute_dtype_picks_bf16_only_where_it_pays(cpuinfo, backend, hidden, param_dtype, expected):
    picked, why = host_cpu.auto_compute_dtype(param_dtype=param_dtype, hidden_size=hidden, backend=backend,
                                              cpuinfo=cpuinfo)
    assert picked == expected and why


def test_auto_is_the_trainers_default_and_resolves_on_load(monkeypatch):
    from jaxrl_vr.train.config import ModelConfig, PipelineConfig
    from jaxrl_vr.train.sources import resolved_compute_dtype

    assert ModelConfig().compute_dtype == "auto"
    cfg = PipelineConfig()
    lines = []
    monkeypatch.setattr(host_cpu, "read_cpuinfo", lambda: XEON_AMX)
    wide = DecoderConfig(vocab_size=16, hidden_size=576, intermediate_size=64, num_layers=1, num_heads=2,
                         num_kv_heads=2, head_dim=8)
    assert resolved_compute_dtype(cfg, wide, log=lines.append) == "bfloat16"
    assert "bfloat16" in lines[-1] and "Platinum 8481C" in lines[-1]
    narrow = wide.replace(hidden_size=96)
    assert resolved_compute_dtype(cfg, narrow, log=lines.append) == ""  # float32 = the parameter dtype
    monkeypatch.setattr(host_cpu, "read_cpuinfo", lambda: EPYC_AVX2)
    assert resolved_compute_dtype(cfg, wide) == ""
    explicit = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, compute_dtype="bfloat16"))
    assert resolved_compute_dtype(explicit, wide) == "bfloat16"  # what is asked for is kept
    with pytest.raises(ValueError, match="compute_dtype='bf16'"):
        ModelConfig(compute_dtype="bf16")
