"""Prefect flows (the training pipeline, re-evaluation) and their deployments.

Defaults that a fresh machine needs before Prefect or Ray start (any set value wins):
Prefect's ephemeral API server can take over a minute to start on a new home directory,
and a local Ray must bind to loopback. Output piped to a file or a CI log has no colour codes
(Prefect's log lines, Ray's prefixes of its workers' lines).
"""
import os
import sys

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # its telemetry writes race the run's own
if not sys.stdout.isatty():
    os.environ.setdefault("PREFECT_LOGGING_COLORS", "false")
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
