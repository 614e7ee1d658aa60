"""experiments/bench/cpu_profile.py: how it reads perf's samples and files them in parts (on known lines), and
its one-line refusals. The real sampling of a running step: tests/e2e/test_cpu_profile.py."""

import pytest

from experiments.bench import cpu_profile

# `perf script -F ip,sym,dso` lines as perf prints them: C++ names keep their parentheses, XLA's JIT code sits in
# an anonymous map, an unresolved address is [unknown].
PERF_SCRIPT = """\
     7fe5ca639f99 ynn::dot_fp32_5x64x1_1x16x1_avx512 (/venv/jaxlib/libjax_common.so)
     7fe5ca639fa0 ynn::dot_fp32_5x64x1_1x16x1_avx512 (/venv/jaxlib/libjax_common.so)
     7fe5ca8b13d5 ynn::transpose_x32_avx512 (/venv/jaxlib/libjax_common.so)
     7fe5ca824fc2 Eigen::internal::gemm_pack_colmajor_block<(anonymous namespace)::M>::operator() (/j/libjax_common.so)
     7fe5ca824fd0 xla::cpu::ThunkExecutor::Execute (/venv/jaxlib/libjax_common.so)
     7fe580396164 [unknown] (/tmp/perf-24253.map)
     7fe580396170 [unknown] (/tmp/perf-24253.map)
     7fe580400000 [unknown] (/tmp/perf-24253.map)
 ffffffff8a1b2c3d clear_page_erms ([kernel.kallsyms])
 ffffffff8a1b2c40 __handle_mm_fault ([kernel.kallsyms])
     7fe5d0001000 __memmove_avx512_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)
     7fe5d0002000 _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)
a line perf may print that is not a sample
"""


def test_samples_are_filed_by_library_and_xla_kernels_by_name():
    samples = cpu_profile.read_samples(PERF_SCRIPT)
    assert len(samples) == 12 and samples[3][1].startswith("Eigen::internal::gemm_pack")
    assert samples[5] == (0x7fe580396164, "[unknown]", "/tmp/perf-24253.map")
    names = {0x7fe580396164: "multiply_add_fusion", 0x7fe580396170: "multiply_add_fusion"}  # the third unnamed
    parts, kernels, named = cpu_profile.summarize(samples, names, kernels=5)
    assert parts == pytest.approx({"ynnpack_products": 2 / 12, "ynnpack_other": 1 / 12, "eigen_products": 1 / 12,
                                   "runtime": 1 / 12, "xla_generated": 3 / 12, "kernel_zeroing_pages": 1 / 12,
                                   "kernel_other": 1 / 12, "libc": 1 / 12, "other": 1 / 12})
    assert kernels == [("multiply_add_fusion", pytest.approx(2 / 12))] and named == pytest.approx(2 / 3)
    assert list(parts) == [p for p in cpu_profile.PARTS if p in parts]  # printed in the documented order


def test_bad_options_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        cpu_profile.main(["--config", "tiny", "--seconds", "0"])
    assert exit_.value.code == 2 and "--seconds must be > 0" in capsys.readouterr().err
