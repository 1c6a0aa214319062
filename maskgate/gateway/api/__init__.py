"""The gateway's own answers beside the route table: probes, and the OpenAPI path tables."""
