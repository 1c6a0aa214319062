"""The inference path: check a client body, send it upstream, check and relay the answer."""
