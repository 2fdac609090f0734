import sys
from pathlib import Path

# suite.py (the shared GPU tests) sits beside the test modules.
sys.path.insert(0, str(Path(__file__).parent))
