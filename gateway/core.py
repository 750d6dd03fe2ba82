"""What the gateway's components share: its live state and its telemetry.

The control plane (lifecycle, console, probes, the HAProxy controller, the snapshot
feed) takes a :class:`Core`, never a data plane: the data planes are leaves that read
the state and feed the telemetry (``tests/test_imports.py`` keeps it so).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.pools import build_pools
from gateway.state import GatewayState
from gateway.telemetry import Telemetry


@dataclass
class Core:
    state: GatewayState
    telemetry: Telemetry = field(default_factory=Telemetry)

    @classmethod
    def for_config(cls, config: GatewayConfig, metrics: GatewayMetrics | None = None,
                   clock: Callable[[], float] = time.monotonic) -> Core:
        """A new state of ``config``'s pools, with its own metrics unless given."""
        state = GatewayState(config, build_pools(config.pools), clock)
        return cls(state, Telemetry(metrics) if metrics is not None else Telemetry())

    @property
    def metrics(self) -> GatewayMetrics:
        return self.telemetry.metrics

    @property
    def clock(self) -> Callable[[], float]:
        return self.state.clock

    async def refresh_gauges(self) -> None:
        """What a ``/metrics`` scrape sees (:meth:`Telemetry.refresh`)."""
        await self.telemetry.refresh(self.state.pools)

    def round(self) -> None:
        """Once per probe round (:meth:`Telemetry.round`)."""
        self.telemetry.round(self.state.pools)
