"""measurements/MANIFEST.json matches the tree: every kept file listed with its checksum, none
rewritten in place, and the files that left the tree named with the commit that still holds them."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import json  # noqa: E402

from benchmarks import manifest  # noqa: E402


def test_the_manifest_matches_the_tree():
    doc = json.loads(manifest.MANIFEST.read_text())
    assert manifest.mismatches(doc) == [], "run python benchmarks/manifest.py (a new result takes a new name)"


def test_every_file_that_left_names_the_commit_holding_it():
    for name, where in json.loads(manifest.MANIFEST.read_text())["left_the_tree"].items():
        assert re.fullmatch(r"in history at [0-9a-f]{40}", where), (name, where)


def test_a_rewritten_or_unlisted_file_is_named(tmp_path, monkeypatch):
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "a.json").write_text("{}")
    monkeypatch.setattr(manifest, "ROOT", tmp_path.parent)
    monkeypatch.setattr(manifest, "MEASUREMENTS", tmp_path)
    monkeypatch.setattr(manifest, "MANIFEST", tmp_path / "MANIFEST.json")
    doc = manifest.build({})
    assert manifest.mismatches(doc) == []
    (tmp_path / "gpu" / "a.json").write_text('{"x": 1}')
    (tmp_path / "gpu" / "b.npz").write_bytes(b"")
    bad = manifest.mismatches(doc)
    assert any("a.json: changed" in b for b in bad) and any("b.npz: in the tree, not in" in b for b in bad)
