"""KServe v2 HTTP inference with the binary-tensor extension (JSON header + raw bytes,
``Inference-Header-Content-Length``), through the gateway: what tritonclient.http sends.

    locust -f loadtests/locustfile_http_binary.py,loadtests/scenarios/spike.py --headless \
        --host http://127.0.0.1:8000
"""

from __future__ import annotations

from typing import Any

import tritonclient.http as httpclient

from loadtests.locust_http import KServeHttpUser


class HttpBinaryUser(KServeHttpUser):
    payload_format = "binary"

    def check(self, resp: Any, model: str) -> None:
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
