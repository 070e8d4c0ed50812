"""The files node-bench deploys, with pyinfra: FILES files `f00000.conf`… in DIR, content
"orc bench file <i>\\n", mode 0644 — one `files.put` per file. Run by run.sh, which passes
ORC_COMPARE_DIR and ORC_COMPARE_FILES."""

import os
from io import StringIO

from pyinfra.operations import files

DIR = os.environ["ORC_COMPARE_DIR"]
FILES = int(os.environ.get("ORC_COMPARE_FILES", "1000"))

files.directory(name="directory", path=DIR, mode="755")
for i in range(FILES):
    files.put(
        name=f"f{i:05d}.conf",
        src=StringIO(f"orc bench file {i}\n"),
        dest=f"{DIR}/f{i:05d}.conf",
        mode="644",
        # The directory exists (above): no check per file.
        create_remote_dir=False,
    )
