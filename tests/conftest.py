import sys
from pathlib import Path

# tests/peer.py is shared by the tests and load_tests/.
sys.path.insert(0, str(Path(__file__).resolve().parent))
