"""A 'training' script that never imports torch (a data-prep step, a shell wrapper's python)."""

import os
import time

time.sleep(0.2)
print(f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')} done without torch", flush=True)
