"""docs/examples/hf_block.py: each family's small Hugging Face block against the golden, on the CPU
(skipped without transformers): every family within float32's rounding of the float64 golden and
routed alike token for token, on 2 ranks' worth of tokens."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")
EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "hf_block.py"


def test_every_family_matches_the_golden():
    seed = str(int.from_bytes(os.urandom(2), "little"))
    done = subprocess.run([sys.executable, str(EXAMPLE), "--tokens", "96", "--seed", seed], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "WORLD_SIZE": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^(\w+) +golden vs HF: max rel. error (\S+), tokens routed differently (\d+) of (\d+)",
                      done.stdout, re.M)
    assert [r[0] for r in rows] == ["mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss"], done.stdout
    for family, err, moved, total in rows:
        assert float(err) < 1e-5 and moved == "0" and total == "192", (family, err, moved, total)
