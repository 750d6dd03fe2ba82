"""Load-test fixtures.

Importing locust runs gevent's ``monkey.patch_all()`` unless LOCUST_SKIP_MONKEY_PATCH is
set, which would patch sockets, threads and subprocess for the whole pytest session and
break other tests. The unit tests here only need locust's classes, so locust is imported
unpatched once, and the variable is removed again so that the real locust runs this
suite starts (subprocesses) are patched as usual.
"""

from __future__ import annotations

import os

_previous = os.environ.get("LOCUST_SKIP_MONKEY_PATCH")
os.environ["LOCUST_SKIP_MONKEY_PATCH"] = "1"
try:
    import locust  # noqa: F401
finally:
    if _previous is None:
        del os.environ["LOCUST_SKIP_MONKEY_PATCH"]
    else:
        os.environ["LOCUST_SKIP_MONKEY_PATCH"] = _previous
