"""Prometheus metrics of this process, served at ``/metrics``."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

TURNS = Counter("sabre_turns_total", "Turns run, by how they ended.", ["status"])
TURN_SECONDS = Histogram(
    "sabre_turn_seconds",
    "Wall time of a turn (request in to state persisted), LLM time included.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
BLOCKS = Counter("sabre_blocks_total", "Sandbox blocks run, by outcome.", ["status"])
BLOCK_SECONDS = Histogram(
    "sabre_block_seconds",
    "Time a block spent in the sandbox.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30),
)
LLM_TOKENS = Counter("sabre_llm_tokens_total", "Tokens billed by the model.", ["direction"])
