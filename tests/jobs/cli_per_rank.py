"""Runs the CLI under horovodrun with `--output-dir BASE/rank<r>`, so a test can see which ranks
wrote files. usage: cli_per_rank.py BASE [hvd-train arguments...]"""

import os
import sys

from hvd_train.cli import main

base, *arguments = sys.argv[1:]
sys.exit(main([*arguments, "--output-dir", f"{base}/rank{os.environ['HOROVOD_RANK']}"]))
