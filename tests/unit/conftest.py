import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # so `from unit.helpers import ...` works
