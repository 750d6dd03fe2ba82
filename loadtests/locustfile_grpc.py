"""KServe v2 gRPC inference (ModelInfer) through the gateway, with ``tritonclient.grpc``
as a locust User: exactly the client applications use.

    locust -f loadtests/locustfile_grpc.py,loadtests/scenarios/ramp.py --headless \
        --host http://127.0.0.1:8000 --grpc-host 127.0.0.1:8001

Each user owns one channel (one HTTP/2 connection), like an application process.
"""

from __future__ import annotations

import random
import time

# gRPC's C core must cooperate with gevent (locust's concurrency) before any channel
# exists, or one blocking call stalls every user in the process.
import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

import tritonclient.grpc as grpcclient  # noqa: E402
from locust import User, task  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from loadtests import locust_common  # noqa: E402
from loadtests.workload import PayloadCache, grpc_metadata  # noqa: E402


class GrpcUser(User):
    def wait_time(self) -> float:
        return 0.0

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.rng = random.Random()
        self.batch_size = options.batch_size if options else 1
        self.client = grpcclient.InferenceServerClient(
            options.grpc_host if options else "127.0.0.1:8001"
        )
        self.payloads = PayloadCache(grpc_metadata(self.client), batch_size=self.batch_size)

    def on_stop(self) -> None:
        self.client.close()

    @task
    def infer(self) -> None:
        model = locust_common.current_mix(self.environment).choose(self.rng)
        exception: Exception | None = None
        length = 0
        start = time.perf_counter()
        try:
            inputs = self.payloads.get(model, "grpc")
            result = self.client.infer(model, inputs)
            for output in self.payloads.meta(model).outputs:
                array = result.as_numpy(output.name)
                if array is None or array.shape[:1] != (self.batch_size,):
                    raise ValueError(f"output {output.name}: shape "
                                     f"{None if array is None else array.shape}")
                length += array.nbytes
        except (InferenceServerException, ValueError) as err:
            exception = err
        self.environment.events.request.fire(
            request_type="grpc",
            name=f"grpc {model}",
            response_time=(time.perf_counter() - start) * 1000.0,
            response_length=length,
            exception=exception,
            context={},
        )
