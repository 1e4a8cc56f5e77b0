"""Prompt sizes are counted with a real tokenizer that needs no network."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.personas.tokens import count_tokens, tokenizer_name

NO_NETWORK = """
import socket

def refuse(*args, **kwargs):
    raise OSError("network is off in this test")

socket.socket.connect = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse

from app.personas.tokens import count_tokens, tokenizer_name
print(tokenizer_name(), count_tokens("Hello world, this is SABRE."))
"""


def test_counts_are_cl100k() -> None:
    assert tokenizer_name() == "cl100k_base"
    # Known cl100k_base counts.
    assert count_tokens("Hello world") == 2
    assert count_tokens("") == 0
    assert count_tokens("<|endoftext|>") > 1  # special tokens are plain text here


def test_tokenizer_works_with_the_network_off_and_no_cache(tmp_path: Path) -> None:
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", NO_NETWORK],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    name, count = done.stdout.split()
    assert name == "cl100k_base"
    assert int(count) == count_tokens("Hello world, this is SABRE.")
