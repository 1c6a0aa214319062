"""SGLang's RL control plane on the gateway: pause/continue, weight sync, worker registration
and the admin API."""
