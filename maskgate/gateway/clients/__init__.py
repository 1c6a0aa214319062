"""The client side of every request: who may call a row (access), reading its body (bodyread),
and bounds on client connections (connections)."""
