"""Helpers for bench/gateway_overhead.py only: the nginx upstream, the proxies under test, the
wrk driver, the RSS sampler and the report. Nothing in the product imports this package."""
