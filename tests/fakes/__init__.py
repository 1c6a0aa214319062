"""The test fakes and the fixtures' building blocks several test directories share. tests/ is
on sys.path (tests/conftest.py), so test modules import them as `fakes.<module>`.

- upstream: `FakeUpstream`, the one configurable fake upstream (in-process, port 0), with the
  engines "openai" (default), "sglang" (sglang_engine.py) and "rl" (rl_engine.py).
- fault_upstream: a fake upstream run as its own process, with run-time fault knobs
  (`POST /_control`), for the fault tests and the soak benchmark, which kill and stop it.
- raw_upstream: fake upstreams on raw sockets that write or keep exact bytes.
- raw_http: one client request on a raw socket, the request line exactly as given.
- serve: an aiohttp app on a free port.
- bodies: mask request bodies the gateway's tests share.
"""
