"""The request loop both HTTP locustfiles share; each supplies its payload format and
how to check an answer (JSON tensors vs the binary-tensor extension)."""

from __future__ import annotations

import random
from typing import Any

from locust import FastHttpUser, task

from loadtests import locust_common
from loadtests.workload import PayloadCache


class KServeHttpUser(FastHttpUser):
    """Closed loop: each user sends its next request as soon as the last one is answered,
    so --scenario-users is the concurrency the gateway sees."""

    abstract = True  # not a user class of its own: locust runs the subclasses
    payload_format = ""  # "json" or "binary", as PayloadCache knows them

    def wait_time(self) -> float:
        return 0.0

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.rng = random.Random()
        self.batch_size = options.batch_size if options else 1
        self.payloads = PayloadCache(locust_common.http_metadata(self.client),
                                     batch_size=self.batch_size)

    @task
    def infer(self) -> None:
        model = locust_common.current_mix(self.environment).choose(self.rng)
        try:
            payload = self.payloads.get(model, self.payload_format)
        except locust_common.MetadataUnavailable:
            return
        with self.client.post(f"/v2/models/{model}/infer", data=payload.body,
                              headers=payload.headers,
                              name=f"http-{self.payload_format} {model}",
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            self.check(resp, model)

    def check(self, resp: Any, model: str) -> None:
        """Mark ``resp`` failed (``resp.failure``) if the answer is not what it should be."""
        raise NotImplementedError
