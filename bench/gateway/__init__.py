"""Helpers for bench/bench_gateway.py only: the nginx upstream, the proxies under test, the
wrk driver, the RSS sampler and the report. Nothing in the product imports this package."""
