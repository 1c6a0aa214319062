"""The maskgate worker: an SGLang-compatible model server with sampling masks.

Importing this package loads no torch (the `maskgate` CLI lives here and must run in the
torch-free gateway image); the model loads when a worker app starts.
"""

from worker.config import WorkerConfig, load_config
from worker.server import create_app

__all__ = ["WorkerConfig", "create_app", "load_config"]
