"""Run telemetry: episode statistics, stage timers, metric writers, plots."""
