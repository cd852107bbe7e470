"""``energon-pack``: demo, prepare, merge, simulate, bench, plan, inspect."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from energon_pack.core.arg_types import (
    comma_separated_ints, comma_separated_ints_or_none, decode_thread_counts, int_at_least, positive_float,
)
from energon_pack.config.policy import DEFAULT_BALANCE_WINDOW_ROWS
from energon_pack.errors import UsageError


#: prepare's options that go to ``prepare_dataset`` under their own names.
_PREPARE_OPTIONS = (
    "split_ratio", "on_error", "samples_per_shard", "allow_assistant_media", "verify_media", "max_image_pixels",
    "workers", "part",
)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from energon_pack.data.parquet_records import TableColumns
    from energon_pack.data.prepare import prepare_dataset

    options = {name: getattr(args, name) for name in _PREPARE_OPTIONS}
    options["columns"] = TableColumns(
        conversation=args.conversation_column, image=args.image_column, video=args.video_column
    )
    return _print_prepare_report(
        "prepare",
        lambda: prepare_dataset(args.input, args.media_root, args.out, processor=_prepare_processor(args.processor), **options),
    )


def _cmd_merge(args: argparse.Namespace) -> int:
    from energon_pack.data.merge import merge_parts

    return _print_prepare_report("merge", lambda: merge_parts(args.dataset))


def _print_prepare_report(command: str, write: Callable[[], Any]) -> int:
    """Run ``write`` (a prepare or merge) and print its report: 0, or 1 when the data failed (``PrepareError``)."""
    from energon_pack.data.prepare import PrepareError, format_report

    try:
        report = write()
    except PrepareError as err:
        print(f"energon-pack {command}: {err}", file=sys.stderr)
        return 1
    print(format_report(report))
    return 0


def _prepare_processor(path: str | None) -> object:
    """The processor ``prepare --processor`` records text tokens for (None: facts only); its
    card is filed too (``qwen.card``), so that ``plan`` reads the facts without loading it."""
    if path is None:
        return None
    from energon_pack.qwen.card import file_processor_card
    from energon_pack.qwen.processor import load_processor

    source = None if path == "default" else path
    processor = load_processor(source)
    file_processor_card(source, processor)
    return processor


def _cmd_demo(args: argparse.Namespace) -> int:
    from energon_pack.cli.demo import run_demo

    return run_demo(out_dir=args.out, num_samples=args.samples, seq_length=args.seq_length, num_workers=args.workers)


def _under_sample_mapping(spec: str | None) -> Any:
    """The context reading foreign datasets under ``--sample-mapping`` (``module:function``)."""
    from energon_pack.formats.sample_mapping import loader_sample_mapping, resolve_mapping

    return loader_sample_mapping(resolve_mapping(spec, where="--sample-mapping"))


def _cmd_simulate(args: argparse.Namespace) -> int:
    from energon_pack.cli.simulate import run_simulate

    with _under_sample_mapping(args.sample_mapping):
        # --family without --dataset is refused by run_simulate before a processor is built
        return run_simulate(args, processor=None if args.dataset is None else _family_processor(args.family))


def _cmd_bench(args: argparse.Namespace) -> int:
    from energon_pack.tools import run_bench

    return run_bench(args)


def _cmd_plan(args: argparse.Namespace) -> int:
    from energon_pack.plan.build import run_plan

    return run_plan(args)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from energon_pack.data.inspect_dataset import run_inspect

    processor = _family_processor(args.family)
    with _under_sample_mapping(args.sample_mapping):
        return run_inspect(args.dataset, split=args.split, limit=args.limit, processor=processor)


def _family_processor(family: str | None) -> Any:
    """The offline processor of ``--family`` (None: None, the default Qwen2.5-VL one read from facts or a card)."""
    if family is None:
        return None
    from energon_pack.qwen.processor import load_processor

    return load_processor(family=family)


def _add_family_option(parser: argparse.ArgumentParser, families: tuple[str, ...]) -> None:
    """``--family``: count a dataset's tokens with that family's offline processor."""
    parser.add_argument(
        "--family", choices=families, default=None,
        help="count tokens with this family's offline processor, e.g. qwen2.5-omni or qwen3-omni for audio (default: qwen2.5-vl)",
    )


_SAMPLE_MAPPING_HELP = (
    "function turning each sample of a foreign dataset (an Energon sample type, or a crude sample, which needs "
    "one) into our record form, as in the packing config's sample_mapping (default: none; the type's default)"
)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the fix (exit code 2), not usage + error."""

    def error(self, message: str) -> NoReturn:
        hint = "" if "fix:" in message else f"; fix: see `{self.prog} --help`"
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


DESCRIPTION = (
    "energon-pack: turn chat records with images and videos into an Energon dataset (prepare; merge for parts), look at it "
    "(inspect), pack it offline or measure packing (simulate, plan, bench), or run everything on synthetic data "
    "(demo). `energon-pack COMMAND --help` describes each command."
)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already states its default
    (the way to describe a None default) or the option is required or positional."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.required or not action.option_strings or action.default in (None, argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


def add_working_folder(parser: argparse.ArgumentParser | argparse._ArgumentGroup, command: str) -> None:
    """``--out``: the folder a synthetic-data command works in, under the cache folder by default."""
    parser.add_argument(
        "--out", type=Path, default=None,
        help=f"working folder (default: $ENERGON_PACK_CACHE/{command} or ~/.cache/energon_pack/{command})",
    )


def add_row_width(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: int) -> None:
    """``--seq-length``: the row width W in tokens."""
    parser.add_argument("--seq-length", type=int, default=default, help="row width W in tokens")


def build_parser() -> argparse.ArgumentParser:
    """The ``energon-pack`` argument parser (one sub-command per job); every option has a help line with its default."""
    from energon_pack import __version__
    from energon_pack.config.row_layout import DEFAULT_MAX_IMAGE_PIXELS
    from energon_pack.qwen.family import FAMILIES

    parser = _Parser(prog="energon-pack", description=DESCRIPTION, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=summary, description=summary, formatter_class=_HelpFormatter)

    demo = command("demo", "offline end-to-end demo on synthetic image+video chats")
    add_working_folder(demo, "demo")
    demo.add_argument("--samples", type=int, default=96, help="synthetic samples to generate")
    add_row_width(demo, default=4096)
    demo.add_argument("--workers", type=int, default=2, help="Energon worker processes")
    demo.set_defaults(func=_cmd_demo)

    prepare = command("prepare", "chat records + media -> Energon WebDataset")
    prepare.add_argument(
        "input", type=Path,
        help="JSON Lines (or JSON list) of chat records, or Parquet: a .parquet file, a folder of them, or a Hugging "
        "Face datasets save_to_disk folder (images/videos as {bytes, path} structs, paths or bytes)",
    )
    prepare.add_argument("--media-root", type=Path, required=True, help="folder the records' media paths are relative to")
    prepare.add_argument("--out", type=Path, required=True, help="dataset folder to write")
    prepare.add_argument(
        "--split-ratio", default="1,0,0", help="train,val,test ratio of records, e.g. 8,1,1; each split gets its own shards"
    )
    prepare.add_argument("--on-error", choices=("skip", "fail"), default="skip", help="bad records: skip (report) or fail")
    prepare.add_argument("--samples-per-shard", type=int, default=100, help="most samples per tar shard")
    prepare.add_argument(
        "--allow-assistant-media",
        action="store_true",
        help="keep records with an image/video in an assistant turn (as context: vision tokens never carry loss)",
    )
    prepare.add_argument(
        "--verify-media",
        action="store_true",
        help="decode every image and video frame (slower) to report media cut after the header now, not in training",
    )
    prepare.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="skip images with more stored pixels (width*height) as pixel_bomb; keep equal to the loader's "
        "max_image_pixels; at most 2 * PIL.Image.MAX_IMAGE_PIXELS, the most Pillow opens",
    )
    prepare.add_argument(
        "--processor",
        default=None,
        help="also record each sample's text tokens for this processor (path or hub id; 'default': the offline "
        "Qwen2.5-VL one), so plan/simulate/inspect read facts instead of the tars, and skip records its chat template "
        "cannot render (tools on a template without tools, unknown template options) (default: media facts only)",
    )
    prepare.add_argument(
        "--workers", type=int, default=1,
        help="processes that read, check and measure the media (1: this process); the dataset is the same for any N",
    )
    prepare.add_argument(
        "--part", default=None, metavar="I/N",
        help="write only part I of N (0..N-1) of the shards, e.g. one job of an array; then `energon-pack merge OUT` "
        "(default: the whole dataset)",
    )
    columns = prepare.add_argument_group("Parquet / datasets input (columns detected when not named)")
    columns.add_argument(
        "--conversation-column", default=None, metavar="NAME",
        help="column of the conversations (default: the first of messages, conversations, texts)",
    )
    columns.add_argument(
        "--image-column", default=None, metavar="NAME",
        help="column of the images: items or lists of {bytes, path} structs, paths or bytes (default: images or "
        "image; '' for none)",
    )
    columns.add_argument(
        "--video-column", default=None, metavar="NAME",
        help="column of the videos, as --image-column (default: videos or video; '' for none)",
    )
    prepare.set_defaults(func=_cmd_prepare)

    merge = command("merge", "finish a dataset written by `prepare --part I/N` runs: index, splits and facts over all parts")
    merge.add_argument("dataset", type=str, help="the --out folder of the parts (a local folder)")
    merge.set_defaults(func=_cmd_merge)

    simulate = command(
        "simulate", "fill and vision patches per row of our bin selection vs first-fit-decreasing per buffer"
    )
    simulate.add_argument(
        "--dataset", type=str, default=None, help="prepared dataset, a folder or msc://profile/path (default: the built-in reference mix)"
    )
    simulate.add_argument("--samples", type=int, default=4000, help="samples of the reference mix")
    simulate.add_argument(
        "--widths", type=comma_separated_ints, default="4096,8192,16384,32768", help="row widths W, comma-separated"
    )
    simulate.add_argument(
        "--buffers", type=comma_separated_ints, default="8,16,32", help="buffer sizes (samples per round), comma-separated"
    )
    simulate.add_argument(
        "--buffer-rows",
        type=comma_separated_ints_or_none,
        default="1,2,4",
        help="token buffers in rows of W, comma-separated: k means buffer_tokens = k * W (\"\": samples only)",
    )
    simulate.add_argument(
        "--max-row-vision-patches",
        type=int,
        default=None,
        metavar="N",
        help="also simulate with at most N ViT patches per row, with and without (default: no budget)",
    )
    simulate.add_argument(
        "--global-plan", action="store_true", help="also plan the whole stream globally (fill, plan time, plan size)"
    )
    simulate.add_argument(
        "--plot", type=Path, default=None, help="write a fill and vision-per-row plot PNG, needs the plot extra (default: no plot)"
    )
    steps = simulate.add_argument_group(
        "step imbalance (with --dp: slowest / mean rank cost per step, today's dealing vs a balanced plan)"
    )
    steps.add_argument(
        "--dp", type=comma_separated_ints, default=None, help="data-parallel sizes, comma-separated (default: no step table)"
    )
    steps.add_argument("--micro-batches", type=comma_separated_ints, default="1,4", help="micro-batches per step, comma-separated")
    steps.add_argument("--seq-length", type=int, default=8192, help="row width W of the step table")
    steps.add_argument(
        "--cost-model", default="qwen2.5-vl-7b", help="model the rows are costed with: preset name or config.json path"
    )
    steps.add_argument("--frozen-vision", action="store_true", help="cost the vision tower as frozen (forward only)")
    steps.add_argument(
        "--workers", type=int_at_least(1), default=2, help="DataLoader workers per rank of the online columns (Energon round-robins them)"
    )
    steps.add_argument(
        "--window-rows", type=int_at_least(1), default=None,
        help=f"rows per worker window of online balanced rows (default: balance_window_rows' default, {DEFAULT_BALANCE_WINDOW_ROWS})"
    )
    simulate.add_argument("--sample-mapping", default=None, metavar="MODULE:FUNCTION", help=_SAMPLE_MAPPING_HELP)
    _add_family_option(simulate, FAMILIES)
    simulate.set_defaults(func=_cmd_simulate)

    bench = command("bench", "side-by-side speed and memory benchmarks against the plain Hugging Face path")
    bench.add_argument(
        "--stage", choices=("preencode", "postencode", "loader", "jpeg", "plan", "foreign", "prepare", "blend", "balance", "audio", "metrics", "all"), default="all", help="which benchmark to run"
    )
    bench.add_argument("--samples", type=int, default=64, help="synthetic samples to benchmark on")
    add_working_folder(bench, "bench")
    bench.add_argument(
        "--media", choices=("synthetic", "realistic", "audio"), default="synthetic",
        help="synthetic: the bench mix of --samples; realistic: 12 MP phone photos, 1080p clips of 30 s to 5 min and "
        "one 4K clip (generated once), ours vs eager per family (loader stage; with --stage balance: plain vs balanced loaders' costs; options below); audio: speech-like "
        "clips of 1-30 s in five codecs, videos with sound, images and text (generated once), ours vs eager per Omni "
        "family (loader stage only; options below)",
    )
    loader = bench.add_argument_group("loader stage (ours vs the eager HF-processor + FFD design) and plan stage (--dataset, --seq-length, --workers)")
    loader.add_argument("--dataset", type=str, default=None, help="prepared dataset, a folder or msc://profile/path (default: the bench mix of --samples)")
    loader.add_argument(
        "--seq-length", type=int_at_least(1), default=None, help="row width W in tokens (default: 8192; --media realistic: 32768)"
    )
    loader.add_argument(
        "--buffer-sizes", type=comma_separated_ints, default="16,64,256", help="buffer sizes, comma-separated"
    )
    loader.add_argument("--workers", type=int, default=2, help="Energon worker processes per loader")
    loader.add_argument(
        "--interleave-rows", type=int_at_least(0), default=1_000_000,
        help="plan stage: synthetic rows of two sources whose metadataset row interleave is timed (0: none)",
    )
    loader.add_argument(
        "--pixel-dtype", type=lambda text: text.split(","), default="float32,uint8",
        help="our pixel payloads, comma-separated (float32, uint8)",
    )
    loader.add_argument("--epochs", type=int, default=3, help="interleaved runs (finite epochs) per setting")
    loader.add_argument("--prefetch-factor", type=int, default=2, help="rows each worker builds ahead")
    loader.add_argument(
        "--decode-threads", type=decode_thread_counts, default="auto",
        help="ours' decode_threads settings, comma-separated, each a setting (auto: the default, cores per decoding process)",
    )
    blend = bench.add_argument_group("blend stage (also --dataset: a metadataset YAML, --seq-length, --workers)")
    blend.add_argument("--rows", type=int_at_least(1), default=200, help="rows read per blend unit (balance stage: per rank)")
    blend.add_argument(
        "--blend-units", type=lambda text: text.split(","), default="samples,tokens,supervised_tokens",
        help="blend units compared, comma-separated",
    )
    prepare_stage = bench.add_argument_group("prepare stage (Parquet with embedded JPEGs against JSON + files)")
    prepare_stage.add_argument(
        "--row-group-rows", type=int_at_least(1), default=1000,
        help="rows per row group of the Parquet file (100: as the Hub's image datasets are written)",
    )
    prepare_stage.add_argument("--rounds", type=int_at_least(1), default=2, help="alternating runs of each kind")
    prepare_stage.add_argument(
        "--baseline", type=Path, default=None,
        help="root of another checkout whose energon_pack also prepares the Parquet file, interleaved (default: none)",
    )
    balance = bench.add_argument_group(
        "balance stage: balanced steps without a plan on real loaders (also --dataset, --seq-length, --workers, --rows)"
    )
    balance.add_argument("--balance-dp", type=int_at_least(1), default=4, help="data-parallel ranks (each a real loader)")
    balance.add_argument("--balance-micro", type=int_at_least(1), default=2, help="micro-batches per step")
    balance.add_argument(
        "--window-rows", type=int_at_least(1), default=DEFAULT_BALANCE_WINDOW_ROWS,
        help="rows per worker window (balance_window_rows)",
    )
    balance.add_argument("--cost-model", default="qwen2.5-vl-3b", help="model the rows are costed with")
    realistic = bench.add_argument_group(
        "--media realistic (also --seq-length, --workers, --epochs, --prefetch-factor; the first of --buffer-sizes)"
    )
    realistic.add_argument(
        "--family", choices=(*FAMILIES, "all"), default="all",
        help="model family (all: qwen2.5-vl, qwen3-vl, qwen3.5; --media audio: every Omni family)",
    )
    realistic.add_argument(
        "--mix-scale", type=positive_float, default=1.0,
        help="clip lengths times this (0.1: clips of 3-30 s and a 6 s 4K clip), sizes unchanged",
    )
    realistic.add_argument("--photos", type=int_at_least(0), default=24, help="12 MP phone photos in the mix")
    realistic.add_argument(
        "--clips", type=int_at_least(0), default=6, help="1080p 30 fps clips in the mix, 30 s to 5 min (geometric spacing)"
    )
    realistic.add_argument("--max-frames", type=int_at_least(2), default=64, help="the processor's frame cap per video")
    realistic.add_argument(
        "--gpu-tokens-per-s", type=positive_float, default=8000.0,
        help="real tokens/s one training GPU consumes, for the cores-per-GPU line (8000: a 7B model on an H100, "
        "see docs/performance.md)",
    )
    audio = bench.add_argument_group(
        "--media audio (also --family, --seq-length (default 8192), --workers, --epochs, --prefetch-factor; the first "
        "of --buffer-sizes)"
    )
    audio.add_argument(
        "--audio-clips", type=int_at_least(0), default=40,
        help="speech-like clips (--clip-seconds long, --audio-formats in turn; every fifth audio chat hears two)",
    )
    audio.add_argument("--sound-videos", type=int_at_least(0), default=6, help="videos of 4-12 s heard with their sound")
    audio.add_argument(
        "--clip-seconds", type=positive_float, nargs=2, default=(1.0, 30.0), metavar=("SHORTEST", "LONGEST"),
        help="clip lengths, uniform between these seconds",
    )
    audio.add_argument(
        "--audio-formats", default="wav_s16,flac,mp3,m4a_aac,ogg_opus",
        help="the clips' formats in turn, comma-separated: wav_s16, wav_s16_44k_stereo, flac, mp3, m4a_aac, ogg_opus",
    )
    audio.add_argument("--images", type=int_at_least(0), default=4, help="chats about a JPEG image")
    audio.add_argument("--images-heard", type=int_at_least(0), default=1, help="of those, chats that also hear a clip")
    audio.add_argument("--text-chats", type=int_at_least(0), default=6, help="text-only chats of two turns")
    bench.set_defaults(func=_cmd_bench)

    plan = command("plan", "pack a whole split once (header-only), for a deterministic, elastic loader")
    plan.add_argument(
        "dataset", type=str,
        help="prepared dataset (one WebDataset folder, or msc://profile/path), or an Energon metadataset YAML blending such datasets",
    )
    plan.add_argument("--config", type=Path, required=True, help="packing config YAML (seq_length, alignment, ...)")
    plan.add_argument("--processor", default=None, help="processor path or hub id (default: the offline Qwen2.5-VL one)")
    plan.add_argument("--out", type=Path, required=True, help="plan file to write")
    plan.add_argument("--split", default="train", help="split to plan")
    plan.add_argument("--workers", type=int, default=None, help="preencode worker processes (default: config num_workers)")
    plan.add_argument(
        "--measure", action="store_true",
        help="preencode every sample even where prepare's facts are present and fresh (default: read fresh facts)",
    )
    plan.add_argument(
        "--facts-dir", type=Path, default=None,
        help="folder where the facts of a dataset read in place (not written by energon-pack prepare) are kept "
        "and reused; nothing is written into such a dataset (default: the folder of --out)",
    )
    plan.set_defaults(func=_cmd_plan)

    inspect = command("inspect", "summarise a prepared dataset: samples, media, token lengths, bad samples")
    inspect.add_argument("dataset", type=str, help="prepared dataset folder (the --out of prepare), or msc://profile/path")
    inspect.add_argument("--split", default="train", help="split to read")
    inspect.add_argument("--limit", type=int, default=None, help="read at most this many samples (default: all)")
    inspect.add_argument("--sample-mapping", default=None, metavar="MODULE:FUNCTION", help=_SAMPLE_MAPPING_HELP)
    _add_family_option(inspect, FAMILIES)
    inspect.set_defaults(func=_cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``energon-pack`` console script.

    Exit codes: 0 success, 1 the data failed (``prepare --on-error fail``, the demo's resume
    check), 2 unusable input (a path, split or option value; one line naming the fix).
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as err:
        print(f"energon-pack {args.command}: error: {err}", file=sys.stderr)
        return 2
