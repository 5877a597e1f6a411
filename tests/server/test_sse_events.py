"""The pre-encoded streamed chunk (sse.DeltaTemplate) is byte-for-byte the JSON event of the same chunk."""

from __future__ import annotations

import json

import pytest

from llmrs.server import sse

TEXTS = ["a", " hello", "", 'quotes " and \\ backslash', "\n\t\r\x00\x1f\x7f", "café 東京 🙂 \u2028\u2029",
         "</script>", "\ud7ff\ue000"]


@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("chat", [False, True])
def test_delta_template_renders_the_same_bytes_as_event(chat, usage):
    head = {"id": 'cmpl-"odd"\\id', "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1700000000, "model": "mödel/ü"}
    tail = {"usage": None} if usage else {}

    def chunk(index, text):
        body = {"delta": {"content": text}} if chat else {"text": text}
        return {**head, "choices": [{"index": index, **body, "logprobs": None, "finish_reason": None}], **tail}

    t = sse.DeltaTemplate(chunk(sse.INDEX_MARK, sse.TEXT_MARK))
    for index in (0, 1, 17, 12345):
        for text in TEXTS:
            got = t.render(index, text)
            assert got == sse.event(chunk(index, text))
            assert json.loads(got[len(b"data: "):])["choices"][0]["index"] == index
