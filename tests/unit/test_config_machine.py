"""trainer.dtype = "auto": bf16 only where the machine's matmul units take it (config/machine.py)."""

from flywheel.config import load_config
from flywheel.config.machine import bf16_matmul_available, cpu_flags

XEON = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma\n"


def test_cpu_flags_read_the_first_cpu():
    assert {"amx_bf16", "avx512_bf16"} <= cpu_flags(XEON + EPYC) and "amx_bf16" not in cpu_flags(EPYC)
    assert cpu_flags("no flags here") == set()


def test_bf16_only_with_units_for_it(tmp_path):
    xeon, epyc, driver = tmp_path / "xeon", tmp_path / "epyc", tmp_path / "nvidia"
    xeon.write_text(XEON)
    epyc.write_text(EPYC)
    none = tmp_path / "absent"
    assert bf16_matmul_available(xeon, none) and not bf16_matmul_available(epyc, none)
    driver.write_text("NVRM version: 580\n")
    assert bf16_matmul_available(epyc, driver)  # a GPU host
    assert not bf16_matmul_available(none, none)  # no /proc/cpuinfo: the safe choice


def test_auto_resolves_when_the_config_loads():
    cfg = load_config("configs/real.toml", [])
    assert cfg.trainer.dtype == ("bfloat16" if bf16_matmul_available() else "float32")
    assert load_config(None, ["--trainer.dtype", "bfloat16"]).trainer.dtype == "bfloat16"
