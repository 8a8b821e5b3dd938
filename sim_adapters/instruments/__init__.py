"""Benchmark instruments: adapters that change an env's timing on purpose (stragglers, a demand
shift mid-run), so schedulers and the resource controller can be measured against them."""
