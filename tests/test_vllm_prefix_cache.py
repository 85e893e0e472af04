"""The engine probe's count of cached-free blocks, kept on vLLM's own ``BlockPool`` (in a process
of its own: it imports vLLM). The shared real server's prefix cache serving a conversation's
returning turns is tested in tests/test_sessions.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, vllm_available

pytestmark = pytest.mark.vllm


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
def test_the_cached_free_count_follows_vllms_block_pool() -> None:
    script = REPO / "tests" / "vllm_block_pool_check.py"
    done = subprocess.run(
        [sys.executable, str(script), "7", "1500"], capture_output=True, text=True, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    operations, peak = map(int, done.stdout.split())
    assert operations == 1500 and peak > 0
