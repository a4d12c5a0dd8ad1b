"""Environment defaults a fresh machine needs before Prefect or Ray start; any value already
set wins. Entry points call `apply_defaults()` first (the `rstar` command, the test suite);
nothing here runs on import. Code that imports the flows itself (a notebook) calls it before
importing Prefect, which reads its settings once, when it loads.

- Prefect's ephemeral API server can take over a minute to start on a new home directory;
  its telemetry writes race the run's own on the SQLite database.
- A local Ray binds to loopback only.
- s3fs and boto3 want a region even for MinIO or moto.
- Output piped to a file or a CI log has no colour codes (Prefect's log lines, Ray's
  prefixes of its workers' lines).
"""

from __future__ import annotations

import os
import sys

DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "AWS_DEFAULT_REGION": "us-east-1",
}
PIPED = {"PREFECT_LOGGING_COLORS": "false", "RAY_COLOR_PREFIX": "0"}


def apply_defaults() -> None:
    for key, value in {**DEFAULTS, **({} if sys.stdout.isatty() else PIPED)}.items():
        os.environ.setdefault(key, value)


class PrefectHomeUnusable(RuntimeError):
    pass


def check_prefect_home() -> None:
    """A run on Prefect's ephemeral server keeps its database under Prefect's home directory.
    One that cannot be made (a parent that is a file, no permission) used to end in a two-minute
    wait for the server and a traceback that never named it; here it is one line. A missing
    parent is made, which Prefect does not do."""
    import tempfile

    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:  # a Prefect server of its own: nothing kept here
        return
    home = str(settings.home)
    try:
        os.makedirs(home, exist_ok=True)
        with tempfile.TemporaryFile(dir=home):
            pass
    except OSError as e:
        raise PrefectHomeUnusable(
            f"Prefect's home PREFECT_HOME={home} cannot be written ({e.strerror}): its local "
            "server keeps its database there; set PREFECT_HOME to a writable directory"
        ) from None
