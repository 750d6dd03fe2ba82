"""KServe v2 HTTP inference with JSON tensors, through the gateway.

    locust -f loadtests/locustfile_http_json.py,loadtests/scenarios/steady.py --headless \
        --host http://127.0.0.1:8000 --csv results/loadtest/locust --html report.html

(or ``python -m loadtests.run --protocol http-json``). JSON tensors are the slow path
(text encoding of every value): compare with the binary locustfile.
"""

from __future__ import annotations

import json
from typing import Any

from loadtests.locust_http import KServeHttpUser


class HttpJsonUser(KServeHttpUser):
    payload_format = "json"

    def check(self, resp: Any, model: str) -> None:
        outputs = json.loads(resp.content or b"{}").get("outputs") or []
        expected = {o.name for o in self.payloads.meta(model).outputs}
        if {o.get("name") for o in outputs} != expected:
            resp.failure(f"outputs {[o.get('name') for o in outputs]} != {sorted(expected)}")
