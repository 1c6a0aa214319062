"""The maskgate worker: an SGLang-compatible model server with sampling masks.

Importing this package loads no torch: the model and the kernels load when a worker app
starts, so `maskgate worker --check-config` runs without them.
"""

from maskgate.worker.config import WorkerConfig, load_config
from maskgate.worker.server import create_app

__all__ = ["WorkerConfig", "create_app", "load_config"]
