"""gpu/provenance.py: a run's provenance; a tool this machine lacks leaves its field empty, never
fails the run."""

import sys

import pytest

from gpu import provenance


def test_command_output_is_stdout_or_empty():
    word = f"w{id(object())}"
    assert provenance.command_output([sys.executable, "-c", f"print(' {word} ')"]) == word
    assert provenance.command_output([sys.executable, "-c", "import sys; print('x'); sys.exit(3)"]) == ""
    assert provenance.command_output([f"no-such-tool-{word}"]) == ""


def test_run_meta_names_the_commit_it_is_given(monkeypatch):
    pytest.importorskip("torch")
    commit = "%040x" % (id(object()) * 7919)
    monkeypatch.setenv("MOELAB_COMMIT", commit)
    meta = provenance.run_meta("moelab gpu --config tiny")
    assert meta["commit"] == commit and meta["command"] == "moelab gpu --config tiny"
    assert {"driver", "gpus_seen", "torch", "nvshmem", "nvcc", "invoked_by"} <= set(meta)
