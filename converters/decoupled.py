"""A decoupled Python-backend model: one request, many responses (an LLM's token stream
in miniature), served by Triton's Python backend like every model here.

Inputs (all but ``text_input`` optional, shape ``[1]``, no batch dimension):
``text_input`` BYTES, ``count`` INT32 (responses to send, default 3), ``delay_ms`` INT32
(wait before each response, default 0), ``fail_at`` INT32 (the response index that is
an error instead, then the stream ends; default -1 = none). Each response carries
``text_output`` = ``"<text_input> <index>"`` and ``index`` INT32. Through
``generate_stream`` every response is one server-sent event.
"""

from __future__ import annotations

from pathlib import Path

DECOUPLED_MODEL_NAME = "stream"

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "count" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "delay_ms" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "fail_at" data_type: TYPE_INT32 dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "index" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
"""

MODEL_PY = '''"""Decoupled test model (written by converters/decoupled.py)."""
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self._respond, args=(request,), daemon=True)
            thread.start()
            self.threads.append(thread)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def _respond(self, request):
        sender = request.get_response_sender()
        text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
        prompt = text.reshape(-1)[0]
        prompt = prompt.decode() if isinstance(prompt, bytes) else str(prompt)
        count = _scalar(request, "count", 3)
        delay_ms = _scalar(request, "delay_ms", 0)
        fail_at = _scalar(request, "fail_at", -1)
        for i in range(count):
            if delay_ms > 0:
                time.sleep(delay_ms / 1000.0)
            if request.is_cancelled():
                break
            if i == fail_at:
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"failed at response {i} as asked")))
                break
            out = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array([f"{prompt} {i}".encode()],
                                                        dtype=np.object_)),
                pb_utils.Tensor("index", np.array([i], dtype=np.int32)),
            ])
            sender.send(out)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)
'''


def build_decoupled_model(repo: Path, name: str = DECOUPLED_MODEL_NAME) -> Path:
    """Write the model directory (version 1) under ``repo``; idempotent."""
    model_dir = repo / name
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(CONFIG.format(name=name))
    (version / "model.py").write_text(MODEL_PY)
    return model_dir
