"""Which FFmpeg threading a video decode uses (docs/performance.md, "Decoder threads by what the
decode does").

FFmpeg decodes with *slice* threads (the slices of one picture at once: nothing delayed, nothing to
flush; a stream of one slice per picture, as x264 writes by default, decodes as with one thread,
and a stream of several slices, as hardware encoders write, in parallel) or *frame* threads
(consecutive pictures at once: every output comes the thread count of packets late, every thread
holds frames of its own, a seek or a drain waits for and flushes them all, and each picture costs
a hand-off between threads).

- Small pictures: one thread. Below `MIN_THREADED_PIXELS` a picture decodes in about the time
  threads spend handing it over (clips of the bench mix, at most 320 px a side, sequential: slice
  threads 1.12x, frame threads 1.65x the CPU seconds of one thread).
- Larger pictures: slice threads, seeking or not. Frame threads are never chosen: the seeking
  decode (`qwen.frames`: a seek and a drain per sampled frame) pays their delay and flush at every
  seek (issue 50: 64 frames of a 1080p web clip, 2.06 s with frame threads, 1.20 s with slice
  threads), and a sequential decode of a 1080p web clip took 1.07-1.09x the wall and CPU seconds
  of one thread with 2 or 4 frame threads on the machines measured (issue 50: 1.42x); frame
  threads gain only where cores sit idle for them, which a loader that gives every core a worker
  does not leave.

More threads are never slower than one: slice threads cost a 1080p decode nothing measurable
(CPU seconds within 2 %) and split pictures of several slices.
"""

from __future__ import annotations

__all__ = ["MIN_THREADED_PIXELS", "decoder_threading"]

#: Fewest pixels per picture (1280 x 720) for more than one decoder thread.
MIN_THREADED_PIXELS = 1280 * 720


def decoder_threading(*, width: int, height: int, threads: int) -> tuple[str, int]:
    """``(thread_type, thread_count)`` for PyAV's ``stream.thread_type`` / ``thread_count`` of a
    decode of ``width`` x ``height`` pictures (0 when the header gives none) with ``threads``
    decoder threads available (>= 1; ``LoaderOptions.resolved_decode_threads``).

    Example: ``decoder_threading(width=1920, height=1080, threads=4)`` -> ("SLICE", 4);
    ``decoder_threading(width=320, height=240, threads=4)`` -> ("SLICE", 1).
    """
    if threads < 1:
        raise ValueError(f"threads={threads}: a decode needs at least 1 thread; fix: pass decode_threads >= 1")
    return "SLICE", threads if width * height >= MIN_THREADED_PIXELS else 1
