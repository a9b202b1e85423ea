"""`moelab app`: start the Streamlit visualizer (streamlit is imported by the app, not here)."""

from __future__ import annotations

import argparse
import importlib.util
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import webbrowser
from pathlib import Path

MAIN = Path(__file__).resolve().parent / "main.py"


def command(port: int) -> list[str]:
    """The `streamlit run` command line that serves the app on `port`. Streamlit always runs
    headless: otherwise its first start stops to ask for an e-mail address on the terminal."""
    return [sys.executable, "-m", "streamlit", "run", str(MAIN), "--server.port", str(port),
            "--server.headless", "true", "--browser.gatherUsageStats", "false"]


def _open_when_up(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                webbrowser.open(url)
                return
        except OSError:
            time.sleep(0.5)


def port_free(number: int) -> bool:
    """Whether this machine can serve on `number` now (nothing else listens there)."""
    with socket.socket() as s:
        try:
            s.bind(("", number))
        except OSError:
            return False
    return True


def cmd_app(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("streamlit") is None:
        print("moelab app: error: streamlit is not installed: pip install -e \".[app]\"", file=sys.stderr)
        return 2
    if not port_free(args.port):
        print(f"moelab app: error: port {args.port} is in use or cannot be served on: pick another with --port N",
              file=sys.stderr)
        return 2
    url = f"http://localhost:{args.port}"
    print(f"moelab app: {url} (Ctrl-C stops it)", file=sys.stderr, flush=True)
    if not args.headless:
        threading.Thread(target=_open_when_up, args=(url,), daemon=True).start()
    try:
        return subprocess.call(command(args.port))
    except KeyboardInterrupt:
        return 0


def port(text: str) -> int:
    """An argparse type: a TCP port a user may serve on, 1024 to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1024 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a port from 1024 to 65535")
    return value


def register(sub) -> None:
    p = sub.add_parser("app", help="start the Streamlit timeline visualizer",
                       description="Serve the visualizer on a local port and open it in a browser; it never "
                                   "needs a GPU. Five pages: Simulate (a config simulated tile by tile), Compare "
                                   "(a measured run beside its prediction), Benchmarks (GPU benchmark runs), "
                                   "Fences (the Perseus story, ibrc beside Perseus' fixes) and Golden (tokens per "
                                   "expert, dropped tokens, bytes between GPUs).",
                       epilog="exit status: streamlit's (0 when stopped with Ctrl-C), 2 a bad option.")
    p.add_argument("--port", type=port, default=8501, help="port to serve on, 1024 to 65535 (default: 8501)")
    p.add_argument("--headless", action="store_true",
                   help="serve only, open no browser (for servers and tests)")
    p.set_defaults(func=cmd_app)
