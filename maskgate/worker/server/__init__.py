"""The worker's HTTP surface (SGLang-compatible)."""

from maskgate.worker.server.app import create_app

__all__ = ["create_app"]
