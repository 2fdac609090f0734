import sys
from pathlib import Path

# harness.py sits beside the tests and is also run as a script.
sys.path.insert(0, str(Path(__file__).parent))
