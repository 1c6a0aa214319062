"""maskgate's gateway: a reverse proxy that enforces the sampling-mask policy and routes
mask requests to a dedicated pool (docs/design.md, Policy and Pools)."""

from maskgate.gateway.app import create_app
from maskgate.gateway.config import GatewayConfig

__all__ = ["GatewayConfig", "create_app"]
