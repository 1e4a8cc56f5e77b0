"""``tau2-sabre``: tau2's own command line with the ``sabre`` agent registered.

tau2 has no plugin entry point for agents, so this runs ``tau2.cli.main`` after registering ours:
every ``tau2`` subcommand and option works the same (``tau2-sabre run --agent sabre ...``). Use
``--max-concurrency`` for parallel simulations (threads in this process), not ``--workers`` (fresh
worker processes that only know tau2's built-in agents).
"""

from __future__ import annotations

import sys

from sabre_tau2.agent import register


def main() -> None:
    """Register the agent, then hand over to tau2."""
    register()
    from tau2.cli import main as tau2_main

    sys.exit(tau2_main())


if __name__ == "__main__":
    main()
