"""Which FFmpeg threading a video decode uses, chosen by what the decode does (docs/performance.md).

FFmpeg decodes with *slice* threads (the slices of one picture at once: nothing delayed, nothing to
flush; a stream of one slice per picture, as x264 writes by default, decodes as with one thread)
or *frame* threads (consecutive pictures at once: every output comes the thread count of packets
late, every thread holds frames of its own, and a seek or a drain waits for and flushes them all,
and each picture costs a hand-off between threads, ~20 us of CPU, whatever its size).

- A decode of small pictures gains less from any threads than they cost: one thread (on 320-px
  clips slice threads cost 1.1x and frame threads 1.7x the CPU seconds of one thread).
- A seeking decode (`qwen.frames`: a seek and a drain per sampled frame, a few pictures between)
  pays frame threads' delay and flush at every seek: slice threads.
- A sequential decode of fewer than `FRAME_THREADS_MIN_FRAMES` frames is mostly frame threads'
  start and final drain: slice threads.
- A sequential decode of at least `FRAME_THREADS_MIN_FRAMES` frames of at least
  `MIN_THREADED_PIXELS` pixels each: frame threads (a 1080p web clip decodes faster in wall
  seconds for the same CPU seconds, when the threads have cores of their own).

The thread count is the caller's (``LoaderOptions.resolved_decode_threads``: the cores left per
decoding process); with one thread both kinds are the same single-threaded decode.
"""

from __future__ import annotations

__all__ = ["FRAME_THREADS_MIN_FRAMES", "MIN_THREADED_PIXELS", "decoder_threading"]

#: Fewest pixels per picture (1280 x 720) for more than one thread: below it a picture decodes in
#: about the time threads spend handing it over.
MIN_THREADED_PIXELS = 1280 * 720
#: Fewest frames a sequential decode outputs for frame threads: a shorter one is mostly the
#: threads' start and the final drain.
FRAME_THREADS_MIN_FRAMES = 64


def decoder_threading(*, seeking: bool, frames: int, width: int, height: int, threads: int) -> tuple[str, int]:
    """``(thread_type, thread_count)`` for PyAV's ``stream.thread_type`` / ``thread_count``.

    ``seeking``: the decode seeks (`qwen.frames.sampled_frames`' seeking pass); ``frames``: the
    frames a sequential decode outputs; ``width`` x ``height``: picture size in pixels (0 when the
    header gives none: one thread); ``threads``: decoder threads available (>= 1).

    Example: ``decoder_threading(seeking=False, frames=3600, width=1920, height=1080, threads=4)``
    -> ("FRAME", 4); ``seeking=True`` -> ("SLICE", 4); a 300-frame 320x240 clip -> ("SLICE", 1).
    """
    if threads < 1:
        raise ValueError(f"threads={threads}: a decode needs at least 1 thread; fix: pass decode_threads >= 1")
    if threads == 1 or width * height < MIN_THREADED_PIXELS:
        return "SLICE", 1
    return ("SLICE" if seeking or frames < FRAME_THREADS_MIN_FRAMES else "FRAME"), threads
