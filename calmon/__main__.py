import sys

from calmon.cli import main

sys.exit(main())
