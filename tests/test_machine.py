"""What the process gives back: an evaluation of several checkpoints in one process frees each
model before the next loads (rstar.pipeline.stages.evaluate)."""


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
