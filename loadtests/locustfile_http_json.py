"""KServe v2 HTTP inference with JSON tensors, through the gateway.

    locust -f loadtests/locustfile_http_json.py,loadtests/scenarios/steady.py --headless \
        --host http://127.0.0.1:8000 --csv results/loadtest/locust --html report.html

(or ``python -m loadtests.run --protocol http-json``). JSON tensors are the slow path
(text encoding of every value): compare with the binary locustfile.
"""

from __future__ import annotations

import json
import random

from locust import FastHttpUser, task

from loadtests import locust_common
from loadtests.workload import PayloadCache


class HttpJsonUser(FastHttpUser):
    # Closed loop: each user sends its next request as soon as the last one is answered,
    # so --scenario-users is the concurrency the gateway sees.
    def wait_time(self) -> float:
        return 0.0

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.rng = random.Random()
        self.payloads = PayloadCache(locust_common.http_metadata(self.client),
                                     batch_size=options.batch_size if options else 1)

    @task
    def infer(self) -> None:
        model = locust_common.current_mix(self.environment).choose(self.rng)
        try:
            payload = self.payloads.get(model, "json")
        except locust_common.MetadataUnavailable:
            return
        with self.client.post(f"/v2/models/{model}/infer", data=payload.body,
                              headers=payload.headers, name=f"http-json {model}",
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            outputs = json.loads(resp.content or b"{}").get("outputs") or []
            expected = {o.name for o in self.payloads.meta(model).outputs}
            if {o.get("name") for o in outputs} != expected:
                resp.failure(f"outputs {[o.get('name') for o in outputs]} != {sorted(expected)}")
