"""maskgate's gateway: a reverse proxy that enforces the sampling-mask policy and routes
mask requests to a dedicated pool (design sections 2 and 4)."""

from maskgate.gateway.app import create_app
from maskgate.gateway.config import GatewayConfig

__all__ = ["GatewayConfig", "create_app"]
