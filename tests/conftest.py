"""Every test runs as on a fresh machine: git reads no global or system configuration (no identity, no
credential helpers, no `safe.directory`), whatever the host has. A test that needs an identity sets its own."""

from __future__ import annotations

import os
import tempfile

_EMPTY = os.path.join(tempfile.mkdtemp(prefix="kakeya-gitconfig-"), "gitconfig")
open(_EMPTY, "w").close()
os.environ["GIT_CONFIG_GLOBAL"] = _EMPTY
os.environ["GIT_CONFIG_NOSYSTEM"] = "1"
