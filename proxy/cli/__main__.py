"""``python -m proxy.cli``: the ``kafka-throttle-proxy`` command (the supervisor starts its workers this way)."""

import sys

from proxy.cli.main import main

sys.exit(main())
