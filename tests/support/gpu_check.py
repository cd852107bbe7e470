"""``make gpu-check``: what only a CUDA machine can tell, in one run of at most 8 minutes, one table.

``python -m tests.support.gpu_check`` (``--help`` for the knobs) on a machine with CUDA:

1. **CUDA tests**: the test files with a ``torch.cuda.is_available()`` skip (found by reading
   tests/), run with pytest; their summary line.
2. **Transfer**: ``rows.step.to_device_batch`` of a wide row (``--row-patches`` patches of 1176
   values, W tokens), uint8 payload (pinned, non-blocking copy, normalised on the device) against
   the float32 payload normalised on the host; rows/s and GB/s of host payload, interleaved, medians.
3. **Model**: the tiny random-weight Qwen2.5-VL (tests/support/tiny_qwen.py) on the model oracle's
   multimodal row (tests/support/model_oracle.py, as tests/golden/test_model_oracle.py): logits of
   the packed row's segments against each sample run alone, and the gradients of a loss summed over
   segments against the sum of the per-sample gradients; float32 within the CPU oracle's 1e-4,
   bfloat16 within `BF16_TOLERANCE` of the largest reference value.
4. **Loader**: our loader's samples/s and real tokens/s on the realistic mix
   (``--mix-scale``, ``--photos``, ``--clips``) with 1, 2, 4, 8 and 14 workers (``--workers``),
   one epoch each, and cores per GPU: modelled (workers' CPU seconds per token times
   ``--gpu-tokens-per-s``) and measured (workers / (tokens/s / ``--gpu-tokens-per-s``)).

Without CUDA it says so and exits 0 (nothing to check here). Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
#: bfloat16 logits and gradients: largest difference at most this fraction of the largest reference value.
BF16_TOLERANCE = 0.02
#: float32: the CPU model oracle's absolute tolerance on logits (tests/golden/test_model_oracle.py); gradients
#: are held to it relative to their largest value.
FLOAT32_TOLERANCE = 1e-4
#: A CUDA skip in a test file.
CUDA_SKIP = re.compile(r"skipif\(\s*not torch\.cuda\.is_available\(\)")
Row = dict[str, Any]


def cuda_test_files(tests: Path = ROOT / "tests") -> list[Path]:
    """Test files holding a CUDA skip. Example: -> [tests/rows/test_step.py]."""
    return sorted(path for path in tests.rglob("test_*.py") if CUDA_SKIP.search(path.read_text(encoding="utf-8")))


def run_cuda_tests(files: Sequence[Path], timeout: float = 180.0) -> dict[str, Any]:
    """pytest on ``files`` (one process); its exit status and summary line."""
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *map(str, files)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return {"check": "CUDA tests", "result": lines[-1] if lines else done.stderr[-200:], "ok": done.returncode == 0}


def _payload_bytes(row: Row) -> int:
    """Bytes of the row's host tensors (tokens, metadata, pixels)."""
    tensors = [value for value in row.values() if isinstance(value, torch.Tensor)]
    tensors += [value for value in vars(row["visual_inputs"]).values() if isinstance(value, torch.Tensor)]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def transfer_rates(device: str, *, patches: int, width: int, repeats: int) -> list[dict[str, Any]]:
    """``to_device_batch`` of a uint8 and a float32 row of ``patches`` Qwen patches (1176 values),
    ``width`` tokens, interleaved ``repeats`` times (device synchronised, pixels normalised for the
    model): medians as rows/s and GB/s of host payload."""
    from energon_pack.rows.step import to_device_batch
    from tests.support.thd_rows import make_row

    side = max(1, int(patches**0.5) // 2 * 2)
    images = max(1, patches // (side * side))
    lengths = [width // (images + 1)] * images
    rows = {
        dtype: make_row(lengths, width, 8, uint8=dtype == "uint8", grid=(1, side, side), patch_dim=1176)
        for dtype in ("uint8", "float32")
    }
    seconds: dict[str, list[float]] = {dtype: [] for dtype in rows}
    synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(repeats + 1):  # the first round warms up (allocator, kernels)
        for dtype, row in rows.items():
            synchronize()
            start = time.perf_counter()
            moved = to_device_batch(row, device)
            moved["visual_inputs"].normalized_for_model()
            synchronize()
            seconds[dtype].append(time.perf_counter() - start)
    figures = []
    for dtype, row in rows.items():
        median = statistics.median(seconds[dtype][1:])
        figures.append({
            "check": f"to_device_batch {dtype}", "result": f"{1 / median:.1f} rows/s, "
            f"{_payload_bytes(row) / median / 1e9:.2f} GB/s ({_payload_bytes(row) / 2**20:.0f} MiB a row)",
            "ok": True, "seconds": median,
        })
    figures.append({"check": "uint8 / float32 rows/s", "result": f"{seconds_ratio(seconds):.2f}x", "ok": True})
    return figures


def seconds_ratio(seconds: dict[str, list[float]]) -> float:
    """float32 median seconds over uint8 median seconds (warm-up round dropped). Example:
    ``{"uint8": [9, 1, 1], "float32": [9, 3, 3]}`` -> 3.0."""
    return statistics.median(seconds["float32"][1:]) / statistics.median(seconds["uint8"][1:])


def _to(value: Any, device: str, dtype: torch.dtype) -> Any:
    """``value`` on ``device``; floating tensors as ``dtype`` (integer ones keep theirs)."""
    if not isinstance(value, torch.Tensor):
        return value
    return value.to(device=device, dtype=dtype if value.is_floating_point() else value.dtype)


def _logits_and_grads(model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(logits [L, V] float32, parameter gradients) of one forward and a backward of the sum of squared logits."""
    model.zero_grad(set_to_none=True)
    logits = model(**inputs).logits[0].float()
    logits.pow(2).mean(dim=-1).sum().backward()
    grads = {name: param.grad.detach().float().clone() for name, param in model.named_parameters() if param.grad is not None}
    return logits.detach(), grads


def model_agreement(device: str, dtype: torch.dtype, cases: Sequence[Any] | None = None) -> dict[str, Any]:
    """Packed row of the oracle's ``cases`` (default: its 5 multimodal ones) vs each sample alone on
    the tiny Qwen2.5-VL in ``dtype``: the largest logit and gradient differences, relative to the
    largest reference value (float32: logits absolute, as the CPU oracle)."""
    from energon_pack.qwen.processor import load_processor
    from tests.support.model_oracle import MAX_PIXELS, MIN_PIXELS, MULTIMODAL_CASES, pack_cases, packed_inputs
    from tests.support.tiny_qwen import tiny_qwen25_vl

    processor = load_processor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    packed = pack_cases(processor, list(cases or MULTIMODAL_CASES), seq_length=320, pad_to_multiple_of=8)
    model = tiny_qwen25_vl(seed=0).to(device=device, dtype=dtype)
    inputs = {name: _to(value, device, dtype) for name, value in packed_inputs(packed.row).items()}
    logits, grads = _logits_and_grads(model, inputs)
    cu = packed.row["cu_seqlens_q"]
    segments = torch.split(logits, (cu[1:] - cu[:-1]).tolist())
    logit_error = logit_scale = 0.0
    summed: dict[str, torch.Tensor] = {}
    for segment, reference in zip(segments, packed.references):
        alone, alone_grads = _logits_and_grads(model, {
            **{name: _to(value, device, dtype) for name, value in reference.items()}, "use_cache": False})
        logit_error = max(logit_error, (segment - alone).abs().max().item())
        logit_scale = max(logit_scale, alone.abs().max().item())
        for name, grad in alone_grads.items():
            summed[name] = summed[name] + grad if name in summed else grad
    grad_error = max((grads[name] - summed[name]).abs().max().item() for name in summed)
    grad_scale = max(grad.abs().max().item() for grad in summed.values())
    float32 = dtype == torch.float32
    logit_figure = logit_error if float32 else logit_error / logit_scale
    tolerance = FLOAT32_TOLERANCE if float32 else BF16_TOLERANCE
    name = "float32" if float32 else "bfloat16"
    ok = logit_figure <= tolerance and grad_error / grad_scale <= tolerance
    return {
        "check": f"tiny Qwen2.5-VL {name}: packed vs alone",
        "result": f"logits {'max abs' if float32 else 'max rel'} {logit_figure:.2e}, grads max rel "
        f"{grad_error / grad_scale:.2e} (tolerance {tolerance:g})",
        "ok": ok,
    }


def loader_scaling(
    work_dir: Path, workers: Sequence[int], *, mix_scale: float, photos: int, clips: int, gpu_tokens_per_s: float,
) -> list[dict[str, Any]]:
    """Our loader (uint8, W=32768, B=16) for one epoch over the realistic mix per worker count."""
    from energon_pack.qwen.processor import load_processor
    from energon_pack.tools.bench_loader import LoaderBenchOptions, LoaderSetting, measure_settings
    from energon_pack.tools.bench_realistic import cores_per_gpu
    from energon_pack.tools.realistic_mix import RealisticMix, clip_durations, realistic_dataset

    dataset = realistic_dataset(work_dir, RealisticMix(photos=photos, clip_seconds=clip_durations(clips)).scaled(mix_scale))
    processor = load_processor(family="qwen2.5-vl", max_frames=64)
    ours = LoaderSetting(side="ours", pixel_dtype="uint8", buffer_size=16)
    figures = []
    for count in workers:
        options = LoaderBenchOptions(dataset=dataset, seq_length=32768, buffer_sizes=(16,), workers=count,
                                     pixel_dtypes=("uint8",), epochs=1, prefetch_factor=2)
        run = measure_settings([ours], options, dataset, processor)[0][ours][0]
        tokens_per_s = run.real_tokens / run.seconds
        modelled = cores_per_gpu(gpu_tokens_per_s, run.worker_seconds.get("cpu", float("nan")), run.real_tokens)
        figures.append({
            "check": f"loader, {count} worker(s)",
            "result": f"{run.samples / run.seconds:.2f} samples/s, {tokens_per_s:.0f} tokens/s, cores per GPU: "
            f"measured {count * gpu_tokens_per_s / tokens_per_s:.2f}, modelled {modelled:.2f}",
            "ok": run.samples > 0,
        })
    return figures


TABLE_HEADER = "| check | result | ok |\n|---|---|---|"


def table_row(figure: dict[str, Any]) -> str:
    """One check as a row of the Markdown table under `TABLE_HEADER`.
    Example: ``{"check": "a", "result": "1", "ok": False}`` -> "| a | 1 | NO |"."""
    return f"| {figure['check']} | {figure['result']} | {'yes' if figure['ok'] else 'NO'} |"


def checks(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Every check's figures, one at a time (a run cut short by its time limit keeps the rows so far)."""
    yield run_cuda_tests(cuda_test_files())
    yield from transfer_rates("cuda", patches=args.row_patches, width=32768, repeats=args.repeats)
    for dtype in (torch.float32, torch.bfloat16):
        yield model_agreement("cuda", dtype)
    yield from loader_scaling(args.work_dir, args.workers, mix_scale=args.mix_scale, photos=args.photos,
                              clips=args.clips, gpu_tokens_per_s=args.gpu_tokens_per_s)


def _workers(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip().isdigit()]
    if not counts or len(counts) != len(text.split(",")) or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--workers {text!r}: give worker counts >= 1, comma-separated, e.g. 1,2,4")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    """Run every check on CUDA and print the table; without CUDA say so and return 0."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.gpu_check", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", type=_workers, default=[1, 2, 4, 8, 14], help="loader worker counts")
    parser.add_argument("--mix-scale", type=float, default=0.1, help="realistic mix clip lengths times this")
    parser.add_argument("--photos", type=int, default=24, help="12 MP photos in the realistic mix")
    parser.add_argument("--clips", type=int, default=6, help="1080p clips in the realistic mix")
    parser.add_argument("--gpu-tokens-per-s", type=float, default=8000.0, help="real tokens/s one GPU trains")
    parser.add_argument("--row-patches", type=int, default=32768, help="patches of the transfer row (1176 values each)")
    parser.add_argument("--repeats", type=int, default=10, help="interleaved transfers of each payload")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "energon_pack_gpu_check",
                        help="folder the realistic mix is generated and cached in")
    args = parser.parse_args(argv)
    for name in ("mix_scale", "row_patches", "repeats", "gpu_tokens_per_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be > 0")
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); it needs a machine with one. "
              "Nothing checked.")
        return 0
    print(f"gpu-check on {torch.cuda.get_device_name(0)}, torch {torch.__version__}\n\n{TABLE_HEADER}", flush=True)
    ok = True
    for figure in checks(args):
        print(table_row(figure), flush=True)
        ok = ok and figure["ok"]
    return 0 if ok else 1

if __name__ == "__main__":
    raise SystemExit(main())
