"""Serving an aiohttp app on a free port for one test: the fakes' servers and any app a test
builds itself."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web


async def start_site(
    app: web.Application, host: str = "127.0.0.1", port: int = 0, **runner: Any
) -> tuple[web.AppRunner, str]:
    """`app` listening on host:port (0: a free port); the runner (to clean up) and its URL.
    `runner` holds extra web.AppRunner arguments (handler_cancellation, ...)."""
    app_runner = web.AppRunner(app, access_log=None, **runner)
    await app_runner.setup()
    site = web.TCPSite(app_runner, host, port)
    await site.start()
    return app_runner, f"http://{host}:{app_runner.addresses[0][1]}"


@contextlib.asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """`app` listening on 127.0.0.1 until the block ends; yields its base URL."""
    runner, url = await start_site(app)
    try:
        yield url
    finally:
        await runner.cleanup()
