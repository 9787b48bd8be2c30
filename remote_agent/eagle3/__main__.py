from remote_agent.eagle3.cli import main
from remote_agent.eagle3.distributed import exit_process

exit_process(main())
