"""`harnessrl engine serve` / `python -m harnessrl.trainers.engine`: run the local engine."""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--model", default="smollm2-135m", help="prepared model name or folder (default smollm2-135m)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default loopback)")
    parser.add_argument("--port", type=int, default=30000, help="TCP port (default 30000, SGLang's)")
    parser.add_argument("--max-running-requests", type=int, default=32, help="largest decode batch")
    parser.add_argument("--weight-version", default="default", help="version reported before any update")
    parser.add_argument("--incremental-streaming-output", action="store_true",
                        help="stream only new tokens per chunk (SGLang's flag of the same name)")
    parser.add_argument("--num-threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    parser.add_argument("--logprob-space", choices=["sampled", "tempered"], default="sampled",
                        help="report logprobs of the filtered distribution sampled from (default) or, "
                             "as SGLang does, at the temperature before top-p/top-k")
    parser.add_argument("--cpu-matvec", choices=["auto", "on", "off"], default="auto",
                        help="CPU decode of up to 8 rows as one compiled C step: auto (on one thread, "
                             "default), on, off (torch and MKL)")
    parser.add_argument("--prompt-lookup-ngram", type=int, default=6,
                        help="speculative decoding of a lone request in the C step: drafts from the longest "
                             "earlier match of 2..N tokens, same outputs (default 6; 0 off)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C; a start-up failure is one line on stderr and exit status 2."""
    from pydantic import ValidationError

    from harnessrl.trainers.engine.runner import EngineStartupError, serve

    try:
        serve(args.model, host=args.host, port=args.port, max_running_requests=args.max_running_requests,
              weight_version=args.weight_version, incremental_streaming_output=args.incremental_streaming_output,
              num_threads=args.num_threads, api_key=args.api_key, logprob_space=args.logprob_space,
              cpu_matvec=args.cpu_matvec, prompt_lookup_ngram=args.prompt_lookup_ngram)
    except EngineStartupError as e:
        print(f"harnessrl engine: {e}", file=sys.stderr)
        return 2
    except ValidationError as e:
        print(f"harnessrl engine: bad option: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="harnessrl engine serve", description=__doc__))
    return run(parser.parse_args(argv))
