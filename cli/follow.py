"""``millstream inject-files DIR --follow``: the directory's files as they come
(injectors/follow.py), until Ctrl-C or SIGTERM; then what was sent is flushed and the command
exits 0, leaving the stream unfinished for the next run to go on."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from injectors.follow import follow_directory
from runtime.security import Security


def follow_command(args: argparse.Namespace, masters: str, security: Security) -> int:
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():  # a second Ctrl-C: at once (what was not flushed goes with the next run)
            raise KeyboardInterrupt
        stop.set()

    handlers = {sig: signal.signal(sig, stopping) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        n = follow_directory(args.directory, masters, args.stream, args.name, security=security,
                             allow_code=args.allow_code or "", key_field=args.key_field,
                             time_field=args.timestamp_field, unit=args.timestamp_unit,
                             max_delay_us=None if args.max_delay_s is None else round(args.max_delay_s * 1e6),
                             poll_s=1.0 if args.poll_s is None else args.poll_s, done_dir=args.done_dir, stop=stop,
                             started=lambda: print(f"following {args.directory!r} into {args.stream!r}; Ctrl-C stops",
                                                   file=sys.stderr, flush=True))
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    print(f"sent {n} lines into {args.stream!r}; the stream is not finished: run the same command again to go on")
    return 0
