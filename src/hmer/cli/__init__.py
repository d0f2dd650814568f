"""The `hmer` command: a thin front end over the library (`hmer --help` lists its commands).

One module per command (`hmer.cli.train` is `hmer train`): each adds its parser to the command list
and holds the functions that run it, importing the library inside them so that `hmer --help` stays fast.

Bad input (a missing file, an unknown run id, a corrupt InkML, a token outside the
vocabulary) ends with a one-line message and exit status 2, never a traceback. SIGTERM and SIGINT
end any command with one line and 128 + the signal's number, after its clean-up (hmer.signals).
"""

from __future__ import annotations

import argparse
import os
import sys

from . import bench, config, data, evaluate, notebooks, report, runs, study, train, ui
from .options import EXIT_USAGE, UserError

__all__ = ["EXIT_USAGE", "UserError", "build_parser", "main"]

# In the order `hmer --help` lists them.
COMMANDS = (data, config, train, study, evaluate, report, runs, ui, notebooks, bench)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    from ..allocator import tune_malloc

    tune_malloc()  # keep freed tensor memory in the process (hmer.allocator): decoding 6-8 % faster
    try:
        if hasattr(args, "tracking_uri"):  # a command that talks to MLflow: is its server up?
            from ..tracking.store import check_tracking_server

            check_tracking_server(args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", ""))
        from ..signals import stop_on_signals

        with stop_on_signals():  # SIGTERM as Ctrl-C: `finally` blocks run (a publish's staging copy removed)
            return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:  # Ctrl-C, or hmer.signals.Stopped (SIGTERM/SIGINT during training)
        print(f"hmer: {exc}" if getattr(exc, "signal_name", None) else "hmer: interrupted", file=sys.stderr)
        return getattr(exc, "exit_status", 130)  # 128 + the signal's number, as a shell reports it
    except Exception as exc:  # noqa: BLE001 - sorted into user errors and bugs below
        from ..tracking.models import RunNotFoundError

        if isinstance(exc, (UserError, RunNotFoundError, FileNotFoundError, IsADirectoryError, PermissionError,
                            KeyError, ValueError)):
            # one line, whatever the library's message: a log reader greps for it
            print(f"hmer: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return EXIT_USAGE
        raise


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hmer", description="Handwritten mathematical expression recognition: "
                                "an ablation suite (BTTR, CoMER, WAP, ConvS2S) with MLflow and Optuna.")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return p
