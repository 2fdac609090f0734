import sys
from pathlib import Path

# suite.py (the shared GPU tests) sits beside the test modules.
sys.path.insert(0, str(Path(__file__).parent))


def pytest_addoption(parser):
    parser.addoption("--mutants", action="store_true", default=False,
                     help="also serve the GPU mutants of test/mutants.py and require the "
                          "equality checks to reject each")
