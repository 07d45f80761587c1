import sys

from harnessrl.trainers.engine.cli import main

sys.exit(main())
