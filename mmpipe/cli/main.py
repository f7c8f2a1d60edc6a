"""The ``mmpipe`` command line.

    mmpipe encode rows.jsonl --processor DIR --out enc/ [--num-proc 4 --max-length 4096 ...]
    mmpipe inspect enc/ [--json]
    mmpipe validate enc/ [--processor DIR]             # mmpipe.validate_dataset; exit 1 on errors
    mmpipe demo [--family qwen3_vl --rows 20 ...]      # python -m mmpipe.cli.demo's arguments

``encode`` turns a local dataset (.jsonl/.json/.parquet or a ``save_to_disk`` directory) into
encoded rows saved with ``save_to_disk`` (`mmpipe.cli.encode`); ``inspect`` prints the counts
and histograms of an encoded dataset (`mmpipe.cli.inspect`); ``demo`` runs `mmpipe.cli.demo`.
Errors in the arguments or the input exit with status 2 and one line saying what to fix; a
row that fails to encode exits with status 1 and names the row; Ctrl-C exits with 130 and SIGTERM
with 143 (``--out`` untouched, the staging directory removed); ``mmpipe ... | head`` ends quietly
(`mmpipe.cli.stops`).

    mmpipe judge ping --base-url http://localhost:8000/v1 --model Qwen/Qwen3-VL-8B-Instruct \\
        --image frame.png [--task "stack the red cube on the green cube"] [--primitive grasp]

``judge ping`` asks a real server both judge questions about one image and prints the two
answers, the reward and the latency (``--json`` for one JSON object). Exit status: 0 when
both answers were valid, 1 when not (the errors and raw answers are printed), 2 for bad
arguments. Also runnable as ``python -m mmpipe.cli.main ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from mmpipe.cli.stops import interruption, reader_left, sigterm_interrupts, stopped

DEFAULT_PRIMITIVES = "reach,grasp,lift,place,release"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmpipe", description="mmpipe command line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    from mmpipe.cli.encode import add_encode_parser
    from mmpipe.cli.inspect import add_inspect_parser
    from mmpipe.cli.validate import add_validate_parser

    add_encode_parser(sub)
    add_inspect_parser(sub)
    add_validate_parser(sub)
    sub.add_parser("demo", help="run the offline demo (python -m mmpipe.cli.demo; arguments passed through)",
                   add_help=False)
    judge = sub.add_parser("judge", help="VLM judge (reward) tools").add_subparsers(dest="judge_command", required=True)
    ping = judge.add_parser("ping", help="ask a VLM server both judge questions about one image")
    ping.add_argument("--base-url", required=True, help="OpenAI-compatible root, e.g. http://localhost:8000/v1")
    ping.add_argument("--model", required=True, help="served model name (GET <base-url>/models lists them)")
    ping.add_argument("--image", required=True, help="path of the frame to judge (PNG, JPEG, ...)")
    ping.add_argument("--task", default="complete the manipulation task shown in the image",
                      help="task description (default: %(default)r)")
    ping.add_argument("--primitives", default=DEFAULT_PRIMITIVES,
                      help="comma-separated available primitives (default: %(default)s)")
    ping.add_argument("--primitive", default=None, help="the chosen primitive (default: the first of --primitives)")
    ping.add_argument("--prev-progress", type=float, default=None, help="previous progress, for the progress term")
    ping.add_argument("--mode", default="bonus_only", choices=("bonus_only", "symmetric", "penalty_only"))
    ping.add_argument("--api-key", default=None, help="API key (servers without --api-key accept any)")
    ping.add_argument("--timeout", type=float, default=60.0, help="seconds per request (default: %(default)s)")
    ping.add_argument("--retries", type=int, default=1, help="retries on transport errors, 429, 5xx")
    ping.add_argument("--no-response-format", action="store_true",
                      help="do not send response_format (for servers that reject it with a 400)")
    ping.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def _ping(args: argparse.Namespace) -> int:
    import os

    from mmpipe.errors import InputError
    from mmpipe.reward import JudgeClient, RewardConfig, VLMJudge, encode_frame

    if not os.path.isfile(args.image):
        print(f"mmpipe judge ping: --image {args.image!r} is not a file; pass the path of a PNG/JPEG frame",
              file=sys.stderr)
        return 2
    primitives = [p.strip() for p in args.primitives.split(",") if p.strip()]
    primitive = args.primitive or (primitives[0] if primitives else "reach")
    try:
        client = JudgeClient(args.base_url, args.model, api_key=args.api_key, timeout_s=args.timeout,
                             max_retries=args.retries, max_concurrency=1,
                             use_response_format=not args.no_response_format)
    except ImportError as e:
        print(f"mmpipe judge ping: {e}", file=sys.stderr)
        return 2
    try:
        frame = encode_frame(args.image)
    except InputError as e:  # a damaged / unsupported image: a message, not a traceback
        print(f"mmpipe judge ping: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    judge = VLMJudge(client, task=args.task, primitives=primitives, reward=RewardConfig(mode=args.mode), cache_size=0)
    try:
        result = judge.judge(frame, primitive, prev_progress=args.prev_progress)
    except KeyboardInterrupt as e:  # Ctrl-C / SIGTERM while waiting for the server
        return stopped("judge ping", e)
    finally:
        judge.close()
    try:
        _print_ping(args, judge, frame, result, primitive, primitives)
    except BrokenPipeError:  # `mmpipe judge ping ... | head`: the reader left
        reader_left()
    return 0 if result.valid else 1


def _print_ping(args: argparse.Namespace, judge, frame, result, primitive: str, primitives: list) -> None:
    if args.json:
        print(json.dumps({"base_url": args.base_url, "model": args.model, "primitive": primitive,
                          **result.to_dict()}, indent=2))
        return
    cfg, parts = judge.reward, result.parts
    w, h = frame.size
    print(f"server    {args.base_url}  model {args.model}")
    print(f"image     {args.image}  ({w}x{h}, {frame.url.split(';')[0][5:]})")
    print(f"task      {args.task}")
    print(f"primitive {primitive}  (of {', '.join(primitives)})")
    for name, answer in (("action", result.action), ("progress", result.progress)):
        if answer.valid:
            fields = "  ".join(f"{k}={v!r}" for k, v in vars(answer.value).items() if v is not None)
            print(f"{name:<9} {fields}  [{answer.latency_s * 1000:.0f} ms, {answer.attempts} attempt(s)]")
        else:
            print(f"{name:<9} INVALID: {answer.error}")
            print(f"{'':<9} raw answer: {answer.raw!r}")
    print(f"reward    {result.reward:.4f}  = scale {cfg.vlm_reward_scale} * ({cfg.binary_weight} * {parts.binary:.4f} "
          f"+ {cfg.progress_weight} * {parts.progress_term:.4f})  mode {cfg.mode}")
    print(f"latency   {result.latency_s * 1000:.0f} ms for both questions")
    print(f"valid     {result.valid}")


# numeric flag of encode / inspect -> (smallest value, what to do instead)
NUMBER_FLAGS = {
    "num_proc": (1, "omit it to encode in this process"), "batch_size": (1, "omit it for the default"),
    "max_length": (1, "omit it for no token budget"), "limit": (1, "omit it to encode every row"),
    "min_pixels": (1, "omit it to keep the processor's min_pixels"),
    "max_pixels": (1, "omit it to keep the processor's max_pixels"), "bins": (1, "e.g. --bins 10"),
}


def check_numbers(args: argparse.Namespace) -> None:
    """Numeric flags out of range -> `CLIError` naming the flag and the fix, before any work
    (``--batch-size 0`` would map the whole dataset as one batch, ``--num-proc 0`` / ``--max-pixels 0``
    would be ignored, ``--bins 0`` would divide by zero)."""
    from mmpipe.cli.encode import CLIError

    for name, (low, fix) in NUMBER_FLAGS.items():
        value = getattr(args, name, None)
        if value is not None and value < low:
            raise CLIError(f"--{name.replace('_', '-')} must be >= {low}, got {value}; {fix}")
    lo, hi = getattr(args, "min_pixels", None), getattr(args, "max_pixels", None)
    if lo is not None and hi is not None and lo > hi:
        raise CLIError(f"--min-pixels {lo} is more than --max-pixels {hi}; give min <= max")


def _run_data_command(args: argparse.Namespace) -> int:
    """encode / inspect / validate: a user error is one line on stderr (2), a row error names the
    row (1), Ctrl-C (130) and SIGTERM (143) say what was left, never a traceback."""
    try:
        return _dispatch(args)
    except BaseException as e:  # noqa: BLE001 - re-raised unless it is Ctrl-C / SIGTERM
        stop = interruption(e)
        if stop is None:
            raise
        return stopped(args.command, stop, "; --out was left as it was (nothing saved)" if args.command == "encode"
                       else "")


def _dispatch(args: argparse.Namespace) -> int:
    from mmpipe.cli.encode import CLIError, run_encode
    from mmpipe.cli.inspect import run_inspect
    from mmpipe.cli.validate import run_validate

    try:
        check_numbers(args)
        return {"encode": run_encode, "inspect": run_inspect, "validate": run_validate}[args.command](args)
    except CLIError as e:
        print(f"mmpipe {args.command}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `mmpipe inspect DIR | head`: the reader left, not an error
        reader_left()
        return 0
    except (ValueError, TypeError, KeyError) as e:  # a row that cannot be encoded names itself
        if interruption(e) is not None:
            raise
        hint = ""
        if args.command == "encode" and getattr(args, "on_error", None) == "raise":
            hint = " (pass --on-error skip to leave failing rows out and list them in the report)"
        print(f"mmpipe {args.command}: {type(e).__name__}: {e}{hint}", file=sys.stderr)
        return 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``mmpipe`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    with sigterm_interrupts():  # SIGTERM stops a command as Ctrl-C does: its cleanup runs
        return _main(argv)


def _main(argv: list) -> int:
    if argv[:1] == ["demo"]:  # everything after `demo` is the demo's own command line
        from mmpipe.cli.demo import main as demo_main

        try:
            return demo_main(argv[1:], prog="mmpipe demo")
        except KeyboardInterrupt as e:
            return stopped("demo", e)
    args = _parser().parse_args(argv)
    if args.command == "judge" and args.judge_command == "ping":
        return _ping(args)
    if args.command in ("encode", "inspect", "validate"):
        return _run_data_command(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
