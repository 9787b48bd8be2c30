import sys

from remote_agent.eagle3.cli import main

sys.exit(main())
