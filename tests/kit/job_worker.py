"""``sabre worker`` with one more task, for the job engine's tests: ``python -m tests.kit.job_worker``.

The process is the one ``sabre worker`` runs (app.worker.run_worker_process, settings from the
environment) with the ``test_marker`` task (tests.kit.marker) added.
"""

from __future__ import annotations

import asyncio
import sys

from app.config import Settings
from app.kit.logging import configure_logging
from app.worker import run_worker_process
from tests.kit.marker import blueprint


def main() -> None:
    configure_logging()
    settings = Settings()
    sys.exit(asyncio.run(run_worker_process(settings, concurrency=2, extra_blueprints=[blueprint])))


if __name__ == "__main__":
    main()
