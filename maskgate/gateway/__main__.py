import sys

from maskgate.gateway.cli import main

sys.exit(main())
