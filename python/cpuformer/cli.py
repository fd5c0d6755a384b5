"""The ``cpuformer`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional


def _cmd_info(args: argparse.Namespace) -> int:
    import cpuformer

    info = cpuformer.cpu_info()
    if args.json:
        print(json.dumps({"version": cpuformer.__version__, **info}))
        return 0
    print(f"cpuformer {cpuformer.__version__}")
    print(f"isa:         {info['isa']} (best this CPU supports: {info['best_isa']})")
    print(f"features:    {' '.join(info['features']) or '(none beyond SSE2)'}")
    print(f"num_threads: {info['num_threads']}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from ._bench import format_table, run_kernel_bench

    rows = run_kernel_bench(quick=args.quick)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cpuformer", description="Fast CPU inference for transformer models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = sub.add_parser("info", help="version, ISA level in use, CPU features, threads")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=_cmd_info)

    bench = sub.add_parser("bench", help="benchmark the kernels on this machine (no model needed)")
    bench.add_argument("--quick", action="store_true", help="fewer shapes and repeats (~20 s)")
    bench.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, NotImplementedError) as error:
        print(f"cpuformer {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
