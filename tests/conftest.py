"""Project-wide test settings.

Each async test module defines its own ``anyio_backend`` fixture (both loops; trio with a
MockClock where no worker thread is involved). pytest-trio's ``trio_mode`` stays off.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Property tests check invariants, not speed: a loaded 2-core CI machine must not fail them
# on hypothesis' per-example deadline.
settings.register_profile(
    "recallbound", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("recallbound")
