"""Named pools of upstream endpoints: selection, admission, circuit breakers, health checks,
DNS discovery and weight versions."""
