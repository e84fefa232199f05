"""uvicorn's server, with SIGTERM as an orchestrator means it: drain first (the port stays open,
readiness fails, running requests finish within the drain timeout), then exit as uvicorn does:
close the port, run the app's shutdown (the engine finishes pending spill writes and publishes its
last KV events). A second SIGTERM, or SIGINT, exits at once as uvicorn would."""

from __future__ import annotations

import logging
import signal
from types import FrameType

import uvicorn

from api.lifecycle.drain import Drain

log = logging.getLogger("uvicorn.error")  # printed with the server's own lines
# what uvicorn may spend on connections still open once the drain is over (timed out)
CLOSE_GRACE_S = 2


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.drain.exit_when_done:
            log.info("SIGTERM: draining (at most %.0f s) before exiting", self.drain.timeout_s)
            self.drain.begin(exit_when_done=True)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain.exit_when_done and self.drain.done:
            if self.drain.active:
                log.warning("drain timed out with %d requests running", self.drain.active)
            return True
        return await super().on_tick(counter)


def serve(app: object, host: str, port: int, log_level: str, drain: Drain) -> None:
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=CLOSE_GRACE_S
    )
    DrainingServer(config, drain).run()
