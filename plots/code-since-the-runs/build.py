import sys
from pathlib import Path
sys.path.insert(0, "/tmp/wt-head/tests")
import same_run
m, d = same_run.build_inputs(Path("/tmp/oldcode/inputs"))
print(m, d)
