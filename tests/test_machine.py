"""The machine: what the process gives back (an evaluation of several checkpoints in one
process frees each model before the next loads, rstar.pipeline.stages.evaluate), and the kernel
sets its CPU runs."""


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_freed_heap_memory_goes_back_to_the_system():
    from rstar.machine import give_back_memory

    # 256 MB in blocks below glibc's mmap threshold, then one allocated after them and kept:
    # freeing the blocks leaves a hole in the heap that free() itself does not return
    blocks = [bytearray(b"x" * 65536) for _ in range(4000)]
    pin = bytearray(b"y" * 65536)
    del blocks
    before = _rss()
    give_back_memory()
    assert before - _rss() > 200e6
    assert pin[0] == ord("y")


def test_the_widest_kernel_set_follows_the_cpu_flags():
    from rstar.machine import widest_kernels

    assert widest_kernels({"sse4_2"}) == "default"
    assert widest_kernels({"avx2", "fma", "avx512f"}) == "avx2"  # avx512 needs bw, vl, dq too
    assert (
        widest_kernels({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}) == "avx512"
    )


def test_vllm_refuses_a_kernel_set_narrower_than_the_cpus():
    import pytest

    from rstar.rollout.vllm_cpu import refuse_narrowed_kernels

    with pytest.raises(RuntimeError, match="ATEN_CPU_CAPABILITY=avx2 is narrower than .* avx512"):
        refuse_narrowed_kernels("AVX2", widest="avx512")
    for fine in (None, "", "avx512", "sve256"):  # unset, the CPU's own, or not an x86 set
        refuse_narrowed_kernels(fine, widest="avx512")
    refuse_narrowed_kernels("avx2", widest="avx2")
