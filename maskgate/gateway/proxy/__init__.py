"""The inference path: read and check a client body, send it upstream, check and relay the
answer."""
