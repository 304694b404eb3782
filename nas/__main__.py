import os
import sys

from nas.cli import main

code = main()
if code == 130:  # interrupted: the study is recorded; leave now, before any shutdown hook can be interrupted too
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
