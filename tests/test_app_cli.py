"""`moelab app`: registered with the moelab command, serving app/main.py headless on the port."""

from pathlib import Path

from app.cli import MAIN, command
from moelab.cli import parser


def test_moelab_app_parses_port_and_headless():
    args = parser().parse_args(["app", "--port", "8600", "--headless"])
    assert (args.command, args.port, args.headless) == ("app", 8600, True)
    assert parser().parse_args(["app"]).port == 8501


def test_the_command_runs_streamlit_on_the_app_file():
    cmd = command(8600)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == MAIN and MAIN.is_file()
    assert cmd[cmd.index("--server.port") + 1] == "8600"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
