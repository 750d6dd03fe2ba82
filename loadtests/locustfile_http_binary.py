"""KServe v2 HTTP inference with the binary-tensor extension (JSON header + raw bytes,
``Inference-Header-Content-Length``), through the gateway: what tritonclient.http sends.

    locust -f loadtests/locustfile_http_binary.py,loadtests/scenarios/spike.py --headless \
        --host http://127.0.0.1:8000
"""

from __future__ import annotations

import random

import tritonclient.http as httpclient
from locust import FastHttpUser, task

from loadtests import locust_common
from loadtests.workload import PayloadCache


class HttpBinaryUser(FastHttpUser):
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
            payload = self.payloads.get(model, "binary")
        except locust_common.MetadataUnavailable:
            return
        with self.client.post(f"/v2/models/{model}/infer", data=payload.body,
                              headers=payload.headers, name=f"http-binary {model}",
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            header_length = resp.headers.get("Inference-Header-Content-Length")
            result = httpclient.InferenceServerClient.parse_response_body(
                resp.content, header_length=int(header_length) if header_length else None
            )
            for output in self.payloads.meta(model).outputs:
                array = result.as_numpy(output.name)
                if array is None or array.shape[:1] != (self.batch_size,):
                    resp.failure(f"output {output.name}: shape "
                                 f"{None if array is None else array.shape}")
                    return
