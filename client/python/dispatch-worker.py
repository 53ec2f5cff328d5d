#!/usr/bin/python3
"""dispatch-worker.py: the reference dispatchd worker on the Python SDK; see --help.

Runs from the SDK's build directory (build/client/python), where the package sits beside it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from dispatchd.reference_worker import main  # noqa: E402

sys.exit(main())
