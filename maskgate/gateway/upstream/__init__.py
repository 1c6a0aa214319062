"""The one place that builds upstream requests: the keep-alive HTTP/1.1 client and its parser."""
