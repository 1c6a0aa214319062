"""Every metric the gateway exports, the lock-free counters behind them, and JSON logs."""
